"""AMQP 1.0 message bodies, as RabbitMQ Stream clients (rstream, rbfly, the Java client) publish them.

A message is a run of sections, each a described type: ``0x00``, a descriptor (``smallulong 0x53 code``
or ``ulong 0x80 u64``), then the value. The sections used here::

    0x74 application-properties   map (string keys)        -> ``properties`` (map<string, string>)
    0x75 data                     binary (0xa0 u8 len | 0xb0 u32 len)   -> ``body`` (data sections joined)
    0x77 amqp-value               any; a binary or string one is the body when there is no data section

Every other section (header, annotations, properties, sequence, footer) is skipped by its encoded size.
A record that does not parse as AMQP 1.0 keeps its raw bytes as ``body`` with ``properties`` null, so
a stream written through another protocol still loads.

:func:`decode_batch` turns whole Arrow columns at a time: the common bare message (one data section and
nothing else) is handled with numpy over the offsets, without a Python step per record; any other
batch falls back to :func:`decode_message` per record.

:func:`decode_documents` serves ``decode=json`` and ``decode=bson``: it reads records by the one record
format of :mod:`riverbed.engine.record` (an AMQP message's payload is its data sections; the content-type
or, failing that, the payload itself says JSON, BSON or bytes), so a record published over any protocol
loads as its columns. Pure functions; thread-safe.
"""

import base64
import json
import struct
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation

import numpy as np
import pyarrow as pa

SECTION_APP_PROPERTIES = 0x74
SECTION_DATA = 0x75
SECTION_AMQP_VALUE = 0x77

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")


class AmqpError(ValueError):
    """Bytes that are not a well-formed AMQP 1.0 encoding."""


def _need(buf, pos, n):
    if pos + n > len(buf):
        raise AmqpError("value runs past the end of the message")


def skip_value(buf, pos):
    """Position just after the AMQP value (described or not) that starts at ``pos``."""
    _need(buf, pos, 1)
    code = buf[pos]
    if code == 0x00:
        return skip_value(buf, skip_value(buf, pos + 1))
    width = code >> 4
    if width == 0x4:
        return pos + 1
    if width in (0x5, 0x6, 0x7, 0x8, 0x9):
        n = {0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}[width]
        _need(buf, pos + 1, n)
        return pos + 1 + n
    if width in (0xA, 0xC, 0xE):
        _need(buf, pos + 1, 1)
        end = pos + 2 + buf[pos + 1]
    elif width in (0xB, 0xD, 0xF):
        _need(buf, pos + 1, 4)
        end = pos + 5 + _U32.unpack_from(buf, pos + 1)[0]
    else:
        raise AmqpError(f"unknown AMQP type code 0x{code:02x}")
    if end > len(buf):
        raise AmqpError("value runs past the end of the message")
    return end


def read_value(buf, pos):
    """``(python value, next position)`` for a primitive value; compound values are returned as their
    raw encoded bytes (they are only ever shown as text here)."""
    _need(buf, pos, 1)
    code = buf[pos]
    p = pos + 1
    if code == 0x00:
        return read_value(buf, skip_value(buf, p))          # the descriptor adds nothing to the text
    if code == 0x40:
        return None, p
    if code in (0x41, 0x42):
        return code == 0x41, p
    if code in (0x43, 0x44):
        return 0, p
    if code == 0x56:
        _need(buf, p, 1)
        return buf[p] != 0, p + 1
    simple = {0x50: _U8, 0x51: _I8, 0x52: _U8, 0x53: _U8, 0x54: _I8, 0x55: _I8, 0x60: _U16, 0x61: _I16,
              0x70: _U32, 0x71: _I32, 0x72: _F32, 0x80: _U64, 0x81: _I64, 0x82: _F64, 0x83: _I64}
    st = simple.get(code)
    if st is not None:
        _need(buf, p, st.size)
        return st.unpack_from(buf, p)[0], p + st.size
    if code in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
        if code >> 4 == 0xA:
            _need(buf, p, 1)
            n, p = buf[p], p + 1
        else:
            _need(buf, p, 4)
            n, p = _U32.unpack_from(buf, p)[0], p + 4
        _need(buf, p, n)
        raw = bytes(buf[p:p + n])
        if code & 0x0F == 0x00:
            return raw, p + n
        return raw.decode("utf-8", "replace"), p + n
    end = skip_value(buf, pos)
    return bytes(buf[pos:end]), end


def _text(v):
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


def _read_map(buf, pos):
    """A map8/map32 at ``pos`` as ``(dict of text, next position)``."""
    code = buf[pos]
    if code == 0xC1:
        _need(buf, pos, 3)
        count, p, end = buf[pos + 2], pos + 3, pos + 2 + buf[pos + 1]
    elif code == 0xD1:
        _need(buf, pos, 9)
        size, count = struct.unpack_from(">II", buf, pos + 1)
        p, end = pos + 9, pos + 5 + size
    elif code == 0x40:
        return {}, pos + 1
    else:
        raise AmqpError(f"application-properties is not a map (type 0x{code:02x})")
    if end > len(buf) or count % 2:
        raise AmqpError("malformed map")
    out = {}
    for _ in range(count // 2):
        k, p = read_value(buf, p)
        v, p = read_value(buf, p)
        out[_text(k)] = _text(v)
    if p != end:
        raise AmqpError("map entries do not fill the map")
    return out, end


def decode_message(raw):
    """``(body bytes or None, properties dict)`` of one AMQP 1.0 message. Raises AmqpError."""
    buf = memoryview(raw)
    pos = 0
    data = []
    value = None
    props = {}
    while pos < len(buf):
        if buf[pos] != 0x00:
            raise AmqpError(f"section at byte {pos} is not a described type")
        _need(buf, pos, 2)
        if buf[pos + 1] == 0x53:
            _need(buf, pos, 3)
            section, p = buf[pos + 2], pos + 3
        elif buf[pos + 1] == 0x80:
            _need(buf, pos, 10)
            section, p = _U64.unpack_from(buf, pos + 2)[0], pos + 10
        else:
            section, p = None, skip_value(buf, pos + 1)      # a symbolic descriptor: skip the section
        _need(buf, p, 1)
        if section == SECTION_DATA:
            v, pos = read_value(buf, p)
            if not isinstance(v, bytes) or buf[p] not in (0xA0, 0xB0):
                raise AmqpError("data section does not hold a binary")
            data.append(v)
        elif section == SECTION_APP_PROPERTIES:
            props, pos = _read_map(buf, p)
        elif section == SECTION_AMQP_VALUE and buf[p] in (0xA0, 0xB0, 0xA1, 0xB1):
            v, pos = read_value(buf, p)
            value = v if isinstance(v, bytes) else v.encode("utf-8")
        else:
            pos = skip_value(buf, p)
    if data:
        return b"".join(data), props
    return value, props


def _bare_data_sections(vo, data):
    """For each record, the header length of a bare message (one data section, nothing else): 5 for
    ``00 53 75 a0 len8``, 8 for ``00 53 75 b0 len32``; 0 for a record that is not such a message."""
    starts = vo[:-1]
    lengths = vo[1:] - starts
    hdr = np.zeros(len(starts), dtype=np.int64)
    ok = lengths >= 5
    if not ok.any():
        return hdr
    s = starts[ok]
    lead = (data[s] == 0) & (data[s + 1] == 0x53) & (data[s + 2] == 0x75)
    kind = data[s + 3]
    l8 = data[s + 4].astype(np.int64)
    short = lead & (kind == 0xA0) & (l8 == lengths[ok] - 5)
    longer = lead & (kind == 0xB0) & (lengths[ok] >= 8)
    if longer.any():
        sl = s[longer]
        l32 = ((data[sl + 4].astype(np.int64) << 24) | (data[sl + 5].astype(np.int64) << 16)
               | (data[sl + 6].astype(np.int64) << 8) | data[sl + 7].astype(np.int64))
        good = l32 == lengths[ok][longer] - 8
        longer_idx = np.flatnonzero(longer)[good]
    else:
        longer_idx = np.empty(0, dtype=np.int64)
    sub = np.zeros(len(s), dtype=np.int64)
    sub[short] = 5
    sub[longer_idx] = 8
    hdr[ok] = sub
    return hdr


def decode_batch(body, map_type):
    """``(body, properties)`` Arrow arrays for a ``binary`` array of AMQP messages.

    ``map_type`` is the Arrow type of the properties column (map<string, string>). A batch of bare
    messages is cut with numpy (one copy of the data, no Python per record); otherwise each record goes
    through :func:`decode_message`.
    """
    n = len(body)
    bufs = body.buffers()
    vo = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=body.offset * 4).astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    hdr = _bare_data_sections(vo, data) if n else np.zeros(0, np.int64)
    if n and body.null_count == 0 and (hdr > 0).all():
        keep = np.ones(int(vo[-1] - vo[0]), dtype=bool)
        base = vo[:-1] - vo[0]
        for width in (5, 8):
            s = base[hdr == width]
            if len(s):
                keep[(s[:, None] + np.arange(width)).ravel()] = False
        out_data = data[int(vo[0]):int(vo[-1])][keep]
        new_vo = np.empty(n + 1, dtype=np.int32)
        new_vo[0] = 0
        new_vo[1:] = (vo[1:] - vo[0]) - np.cumsum(hdr)
        out_body = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(new_vo), pa.py_buffer(out_data)])
        empty = pa.array([], pa.string())
        props = pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), empty, empty, type=map_type)
        return out_body, props
    bodies, maps = [], []
    for raw in body.to_pylist():
        if raw is None:
            bodies.append(None)
            maps.append(None)
            continue
        try:
            b, p = decode_message(raw)
        except (AmqpError, RecursionError):     # a descriptor chain nested past the stack: not a message
            b, p = raw, None
        bodies.append(b)
        maps.append(None if p is None else list(p.items()))
    return pa.array(bodies, pa.binary()), pa.array(maps, map_type)


# ---- decode=json and decode=bson -------------------------------------------------------------------------

def _ejson_scalar(value):
    """The plain value of a relaxed Extended JSON wrapper (what a BSON record becomes for decode=json):
    ``{"$date": iso}`` -> the ISO text, ``{"$date": {"$numberLong": ms}}`` -> int ms, ``{"$oid": h}`` -> h,
    ``{"$numberDecimal": s}`` -> Decimal, ``{"$numberDouble": s}`` -> float, ``{"$numberLong": s}`` -> int,
    ``{"$binary": {"base64": b, ...}}`` -> bytes, ``{"$symbol": s}`` -> s. Anything else is returned as is."""
    if type(value) is not dict or len(value) != 1:
        return value
    (key, inner), = value.items()
    try:
        if key == "$date":
            return _ejson_scalar(inner)
        if key in ("$oid", "$symbol") and isinstance(inner, str):
            return inner
        if key == "$numberLong":
            return int(inner)
        if key == "$numberDouble":
            return float(inner)
        if key == "$numberDecimal":
            return Decimal(inner)
        if key == "$binary" and isinstance(inner, dict):
            return base64.b64decode(inner["base64"])
    except (ValueError, TypeError, KeyError, InvalidOperation):
        pass
    return value


def _document_value(value, arrow_type):
    """A rendered document's value made acceptable to ``pa.array`` for ``arrow_type`` (see
    :func:`_coerce`), Extended JSON wrappers unwrapped at every level."""
    value = _ejson_scalar(value)
    if pa.types.is_struct(arrow_type) and isinstance(value, dict):
        return {f.name: _document_value(value.get(f.name), f.type) for f in arrow_type}
    if (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) and isinstance(value, list):
        return [_document_value(v, arrow_type.value_type) for v in value]
    if pa.types.is_string(arrow_type) and isinstance(value, Decimal):
        return str(value)
    return _coerce(value, arrow_type)


def decode_documents(body, decode, fields):
    """One Arrow array per field of ``fields`` (pyarrow fields) from a ``binary`` array of stored records.

    Each record is read by :func:`riverbed.engine.record.decode_record` and rendered as the protocols of
    ``decode`` see it: ``"json"``, as the JSON protocols do (a JSON payload parsed; BSON as relaxed
    Extended JSON, its wrappers unwrapped to the column types: ``$date`` to a timestamp, ``$oid`` to its
    hex text, ...; bytes as ``{"base64": ...}``); ``"bson"``, as the BSON protocol does (BSON decoded; a
    JSON object read as Extended JSON; bytes as ``{"data": Binary}``). A record that renders as no
    document (a JSON array), a missing field or a value of the wrong type is null. Never raises for bad
    records; pure; thread-safe.
    """
    from riverbed.engine import record
    render = record.to_json_value if decode == "json" else record.to_bson_document
    docs = []
    for raw in body.to_pylist():
        doc = render(record.decode_record(raw)) if raw is not None else None
        docs.append(doc if isinstance(doc, dict) else {})
    cols = []
    for f in fields:
        vals = []
        for d in docs:
            try:
                vals.append(_document_value(d.get(f.name), f.type))
            except (ValueError, TypeError, AttributeError, OverflowError):
                vals.append(None)
        cols.append(_column(vals, f.type))
    return cols


def _coerce(value, arrow_type):
    """A decoded JSON/BSON value made acceptable to ``pa.array`` for ``arrow_type`` (dates and times
    come as ISO-8601 text in JSON); None when it cannot be."""
    if value is None:
        return None
    if pa.types.is_timestamp(arrow_type):
        if isinstance(value, str):
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
            return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return datetime.fromtimestamp(value / 1000, timezone.utc)     # epoch milliseconds
        return None
    if pa.types.is_date(arrow_type):
        if isinstance(value, str):
            return date.fromisoformat(value[:10])
        return value.date() if isinstance(value, datetime) else value
    if pa.types.is_string(arrow_type) and not isinstance(value, str):
        return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)
    if pa.types.is_struct(arrow_type) and isinstance(value, dict):
        return {f.name: _coerce(value.get(f.name), f.type) for f in arrow_type}
    if (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) and isinstance(value, list):
        return [_coerce(v, arrow_type.value_type) for v in value]
    return value


def _column(values, arrow_type):
    try:
        return pa.array(values, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        # one bad value must not fail the batch: null what does not convert (Spark's PERMISSIVE mode).
        # Each value is converted alone and the pieces joined: values that convert one by one may still
        # not convert together (an empty list and a dict for one struct column).
        parts = []
        for v in values:
            try:
                parts.append(pa.array([v], arrow_type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                parts.append(pa.nulls(1, arrow_type))
        return pa.concat_arrays(parts)

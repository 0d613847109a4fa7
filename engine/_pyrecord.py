"""Pure-Python twin of the record codec in ``record.pxi``: AMQP 1.0 bare messages, the one record format.

Every shell except RabbitMQ Stream stores each message as an AMQP 1.0 bare message; a RabbitMQ Stream
client's record is stored exactly as sent. This module is the readable reference and the spec: the
compiled functions of the same names (``_core``) give the same results and raise the same error types.
:mod:`riverbed.engine.record` is the layer the shells call. All functions are pure and thread-safe.

What Riverbed writes (short descriptors ``00 53 xx`` only: that is all rstream reads)::

    properties section, only when there is a content-type or a creation-time
    +----+----+----+------------------------------------------------------------------------+
    | 00 | 53 | 73 | list8  c0 <size u8> <count u8> fields...    (list32 d0 <size u32> <count u32>
    +----+----+----+        when 1 + len(fields) > 255; size counts the bytes after itself)  |
                     field  0 message-id            40 (null)
                            1 user-id               40
                            2 to                    40
                            3 subject               40
                            4 reply-to              40
                            5 correlation-id        40
                            6 content-type          a3 <len u8> ASCII (sym8; b3 <len u32> sym32) or 40
                            7 content-encoding      40                 } only with a creation-time:
                            8 absolute-expiry-time  40                 } the list stops after the last
                            9 creation-time         83 <int64 ms>      } field that is set

    application-properties section, only when there are headers (ZeroMQ X-*, WebSocket pkey)
    +----+----+----+------------------------------------------------------------------------+
    | 00 | 53 | 74 | map8  c1 <size u8> <count u8> (key value)...  (map32 d1 <size u32> <count u32>)
    +----+----+----+  key    a1 <len u8> UTF-8 (str8; b1 <len u32> str32)
                      value  a1/b1 string, or a0 <len u8> / b0 <len u32> bytes (vbin8 / vbin32)
                      count = 2 x entries

    one data section per payload frame, in order, empty frames included
    +----+----+----+------------------------------------------------------------------------+
    | 00 | 53 | 75 | a0 <len u8> bytes   (vbin8, len <= 255)  |  b0 <len u32> bytes  (vbin32)  |
    +----+----+----+------------------------------------------------------------------------+

Integers are big-endian. Note that creation-time is field 9 of the properties list (AMQP 1.0 part 3.2.4;
rstream and rbfly agree); field 8 is absolute-expiry-time.

What Riverbed reads: a record is a message when it parses COMPLETELY as AMQP 1.0::

    message  = [header 70] [delivery-annotations 71] [message-annotations 72] [properties 73]
               [application-properties 74] body [footer 78]
    body     = data 75 {data 75} | amqp-sequence 76 {amqp-sequence 76} | amqp-value 77
    section  = 00 descriptor value
    descriptor = 53 <code u8> | 80 <code u64> | a3/b3 symbol ("amqp:properties:list", ...)

* header and properties and amqp-sequence hold a list (``45`` list0, ``c0``, ``d0``); the annotations,
  application-properties and footer a map (``c1``, ``d1``); data a binary (``a0``, ``b0``); amqp-value
  any value.
* Every value is checked to its end: a known format code, lengths inside their container, compound
  counts that fill their size exactly, maps with an even count, arrays with a constructor. Nesting
  (described values, lists, maps, arrays) deeper than ``MAX_DEPTH`` is refused.
* Every byte is consumed; an empty record is not a message.
* application-properties keys must be strings (``a1``/``b1``, or symbols ``a3``/``b3``).

Anything else is a raw payload (``decode_message`` returns None). Strings handed back are decoded as
UTF-8 with invalid bytes replaced by U+FFFD; strings that are only skipped are not checked.
"""

import json
import operator
import struct
import uuid

COMPILED = False

# Section descriptor codes (AMQP 1.0 part 3.2).
SECTION_HEADER = 0x70
SECTION_DELIVERY_ANNOTATIONS = 0x71
SECTION_MESSAGE_ANNOTATIONS = 0x72
SECTION_PROPERTIES = 0x73
SECTION_APP_PROPERTIES = 0x74
SECTION_DATA = 0x75
SECTION_AMQP_SEQUENCE = 0x76
SECTION_AMQP_VALUE = 0x77
SECTION_FOOTER = 0x78

# Symbolic descriptors, the other spelling of the same sections.
SECTION_NAMES = {
    b"amqp:header:list": SECTION_HEADER,
    b"amqp:delivery-annotations:map": SECTION_DELIVERY_ANNOTATIONS,
    b"amqp:message-annotations:map": SECTION_MESSAGE_ANNOTATIONS,
    b"amqp:properties:list": SECTION_PROPERTIES,
    b"amqp:application-properties:map": SECTION_APP_PROPERTIES,
    b"amqp:data:binary": SECTION_DATA,
    b"amqp:amqp-sequence:list": SECTION_AMQP_SEQUENCE,
    b"amqp:amqp-value:*": SECTION_AMQP_VALUE,
    b"amqp:footer:map": SECTION_FOOTER,
}

# Format codes (AMQP 1.0 part 1.6).
FMT_DESCRIBED = 0x00
FMT_NULL = 0x40
FMT_TRUE = 0x41
FMT_FALSE = 0x42
FMT_LIST0 = 0x45
FMT_BOOLEAN = 0x56
FMT_SMALLULONG = 0x53
FMT_CHAR = 0x73
FMT_FLOAT = 0x72
FMT_ULONG = 0x80
FMT_DOUBLE = 0x82
FMT_TIMESTAMP = 0x83
FMT_UUID = 0x98
FMT_VBIN8 = 0xA0
FMT_STR8 = 0xA1
FMT_SYM8 = 0xA3
FMT_VBIN32 = 0xB0
FMT_STR32 = 0xB1
FMT_SYM32 = 0xB3
FMT_LIST8 = 0xC0
FMT_MAP8 = 0xC1
FMT_LIST32 = 0xD0
FMT_MAP32 = 0xD1
FMT_ARRAY8 = 0xE0
FMT_ARRAY32 = 0xF0

# Fixed-width format codes -> bytes after the code.
FIXED_WIDTH = {
    0x40: 0, 0x41: 0, 0x42: 0, 0x43: 0, 0x44: 0, 0x45: 0,
    0x50: 1, 0x51: 1, 0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x56: 1,
    0x60: 2, 0x61: 2,
    0x70: 4, 0x71: 4, 0x72: 4, 0x73: 4, 0x74: 4,
    0x80: 8, 0x81: 8, 0x82: 8, 0x83: 8, 0x84: 8,
    0x94: 16, 0x98: 16,
}
LISTS = (FMT_LIST0, FMT_LIST8, FMT_LIST32)
MAPS = (FMT_MAP8, FMT_MAP32)
STRINGS = (FMT_STR8, FMT_STR32, FMT_SYM8, FMT_SYM32)

LEN_DESCRIPTOR = 3           # 00 53 xx, all Riverbed writes
LEN_LONG_DESCRIPTOR = 10     # 00 80 <u64>
MAX_DEPTH = 64               # nesting of described and compound values a message may have
MAX_SECTION = 0x7FFFFFFF     # a record is one Osiris entry (31-bit length); so is any part of it
PROPERTY_CONTENT_TYPE = 6
PROPERTY_CREATION_TIME = 9

# decode_message body kinds.
BODY_DATA = 1            # data sections: ``sections`` are their binaries
BODY_VALUE_BINARY = 2    # amqp-value holding a binary: ``[its bytes]``
BODY_VALUE_STRING = 3    # amqp-value holding a string or symbol: ``[its UTF-8 bytes as stored]``
BODY_VALUE = 4           # amqp-value of any other type: ``[its complete AMQP encoding]``
BODY_SEQUENCE = 5        # amqp-sequence sections: ``[each list's complete AMQP encoding]``

# payload_kind answers.
KIND_BYTES = 0
KIND_JSON = 1
KIND_BSON = 2

_JSON_SPACE = b" \t\n\r"
_LEN_BSON_MIN = 5            # int32 length + the terminating 0x00

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_I32LE = struct.Struct("<i")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_SIMPLE = {
    0x50: struct.Struct(">B"), 0x51: struct.Struct(">b"), 0x52: struct.Struct(">B"), 0x53: struct.Struct(">B"),
    0x54: struct.Struct(">b"), 0x55: struct.Struct(">b"), 0x60: struct.Struct(">H"), 0x61: struct.Struct(">h"),
    0x70: _U32, 0x71: struct.Struct(">i"), 0x72: struct.Struct(">f"), 0x80: _U64, 0x81: _I64,
    0x82: struct.Struct(">d"), 0x83: _I64,
}


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


# NaN and Infinity are Python's extension, not JSON: a payload using them is not "one JSON object".
JSON_DECODER = json.JSONDecoder(parse_constant=_no_constant)


class _NotAmqp(Exception):
    """Internal: the record is not a complete AMQP 1.0 message (never escapes this module)."""


# ---- encoding ------------------------------------------------------------------------------------------

def _head(small, big, n):
    """Constructor and length of a variable-width value: the 8-bit form when ``n`` fits a byte."""
    return bytes((small, n)) if n <= 0xFF else bytes((big,)) + _U32.pack(n)


def _compound(small, big, count, body):
    """list8/map8 when size and count fit a byte, else list32/map32. size counts the count field too."""
    if 1 + len(body) <= 0xFF and count <= 0xFF:
        return bytes((small, 1 + len(body), count)) + body
    return bytes((big,)) + struct.pack(">II", 4 + len(body), count) + body


def _utf8(value, what):
    if not isinstance(value, str):
        raise TypeError(f"{what} must be str, not {type(value).__name__}")
    return value.encode("utf-8")


def encode_message(sections, content_type=None, creation_time=None, app_properties=None):
    """One AMQP 1.0 bare message as ``bytes``, laid out as the module docstring shows.

    * ``sections``: an iterable of bytes-like payload frames, one data section each, in order (empty
      ones kept). At least one.
    * ``content_type``: str (ASCII, a symbol) or None; the properties field 6.
    * ``creation_time``: int, ms since the Unix epoch, or None; the properties field 9.
    * ``app_properties``: a dict of str -> str or bytes-like, or None/empty (no section written).

    Raises TypeError (a section that is not bytes-like, a non-str content type or key, a value that is
    neither str nor bytes-like, a creation time that is not an integer), ValueError (no sections, a
    content type that is not ASCII, a section over 2**31-1 bytes), OverflowError (a creation time
    outside int64). Pure; thread-safe.
    """
    parts = []
    if content_type is not None or creation_time is not None:
        fields = b"\x40" * PROPERTY_CONTENT_TYPE
        if content_type is None:
            fields += b"\x40"
        else:
            ct = _utf8(content_type, "content_type")
            content_type.encode("ascii")           # a symbol is ASCII: UnicodeEncodeError (a ValueError)
            fields += _head(FMT_SYM8, FMT_SYM32, len(ct)) + ct
        count = PROPERTY_CONTENT_TYPE + 1
        if creation_time is not None:
            ms = operator.index(creation_time)
            if not _INT64_MIN <= ms <= _INT64_MAX:
                raise OverflowError(f"creation_time {ms} ms does not fit in an AMQP timestamp (int64)")
            fields += b"\x40\x40" + bytes((FMT_TIMESTAMP,)) + _I64.pack(ms)
            count = PROPERTY_CREATION_TIME + 1
        parts.append(b"\x00\x53\x73" + _compound(FMT_LIST8, FMT_LIST32, count, fields))
    if app_properties:
        items = []
        for key, value in app_properties.items():
            k = _utf8(key, "application property key")
            items.append(_head(FMT_STR8, FMT_STR32, len(k)) + k)
            if isinstance(value, str):
                v = value.encode("utf-8")
                items.append(_head(FMT_STR8, FMT_STR32, len(v)) + v)
            else:
                try:
                    v = bytes(memoryview(value))
                except TypeError:
                    raise TypeError(f"application property {key!r} must be str or bytes-like, "
                                    f"not {type(value).__name__}") from None
                items.append(_head(FMT_VBIN8, FMT_VBIN32, len(v)) + v)
        parts.append(b"\x00\x53\x74" + _compound(FMT_MAP8, FMT_MAP32, len(items), b"".join(items)))
    frames = 0
    for frame in sections:
        n = memoryview(frame).nbytes
        if n > MAX_SECTION:
            raise ValueError(f"record of {n} bytes is over the 2 GiB entry limit")
        parts.append(b"\x00\x53\x75" + _head(FMT_VBIN8, FMT_VBIN32, n))
        parts.append(frame)
        frames += 1
    if not frames:
        raise ValueError("an AMQP message needs at least one data section")
    return b"".join(parts)


# ---- decoding ------------------------------------------------------------------------------------------

def _skip_body(buf, code, pos, end, depth):
    """End of the value whose constructor ``code`` has been read; its body starts at ``pos``. Bounded
    by ``end`` (its container's end). Raises _NotAmqp."""
    width = FIXED_WIDTH.get(code)
    if width is not None:
        stop = pos + width
    elif code in (FMT_VBIN8, FMT_STR8, FMT_SYM8):
        if pos >= end:
            raise _NotAmqp
        stop = pos + 1 + buf[pos]
    elif code in (FMT_VBIN32, FMT_STR32, FMT_SYM32):
        if pos + 4 > end:
            raise _NotAmqp
        stop = pos + 4 + _U32.unpack_from(buf, pos)[0]
    elif code in (FMT_LIST8, FMT_MAP8, FMT_LIST32, FMT_MAP32, FMT_ARRAY8, FMT_ARRAY32):
        return _skip_compound(buf, code, pos, end, depth)
    else:
        raise _NotAmqp
    if stop > end:
        raise _NotAmqp
    return stop


def _compound_frame(buf, code, pos, end):
    """``(first element position, count, end)`` of a list/map/array body at ``pos``."""
    if code & 0xF0 in (0xC0, 0xE0):
        if pos + 2 > end:
            raise _NotAmqp
        size, count, first = buf[pos], buf[pos + 1], pos + 2
        stop = pos + 1 + size
        if size < 1:
            raise _NotAmqp
    else:
        if pos + 8 > end:
            raise _NotAmqp
        size, count = struct.unpack_from(">II", buf, pos)
        first, stop = pos + 8, pos + 4 + size
        if size < 4:
            raise _NotAmqp
    if stop > end:
        raise _NotAmqp
    return first, count, stop


def _skip_compound(buf, code, pos, end, depth):
    if depth >= MAX_DEPTH:
        raise _NotAmqp
    p, count, stop = _compound_frame(buf, code, pos, end)
    if code in (FMT_ARRAY8, FMT_ARRAY32):
        elem, p = _constructor(buf, p, stop, depth + 1)
        width = FIXED_WIDTH.get(elem)
        if width is not None:
            # fixed-width elements: no walk (a 0-width type would otherwise loop count times on nothing)
            p += width * count
        else:
            for _ in range(count):
                p = _skip_body(buf, elem, p, stop, depth + 1)
    else:
        if code in MAPS and count % 2:
            raise _NotAmqp
        for _ in range(count):
            p = _skip_value(buf, p, stop, depth + 1)
    if p != stop:
        raise _NotAmqp
    return stop


def _constructor(buf, pos, end, depth):
    """``(format code, position after the constructor)``; a described constructor's descriptor is
    checked and dropped (``00 descriptor constructor``, recursively)."""
    while True:
        if pos >= end:
            raise _NotAmqp
        code = buf[pos]
        if code != FMT_DESCRIBED:
            return code, pos + 1
        if depth >= MAX_DEPTH:
            raise _NotAmqp
        pos = _skip_value(buf, pos + 1, end, depth + 1)
        depth += 1


def _skip_value(buf, pos, end, depth):
    """End of the complete value (described or not) at ``pos``. Raises _NotAmqp."""
    code, p = _constructor(buf, pos, end, depth)
    return _skip_body(buf, code, p, end, depth)


def _text(buf, code, pos, end):
    """``(str, end)`` of a str8/str32/sym8/sym32 value whose code is at ``pos``."""
    stop = _skip_body(buf, code, pos + 1, end, 0)
    start = pos + 2 if code & 0xF0 == 0xA0 else pos + 5
    return buf[start:stop].decode("utf-8", "replace"), stop


def _property_value(buf, pos, end):
    """``(python value, end)`` of an application-properties value (see decode_message)."""
    code = buf[pos]
    if code in STRINGS:
        return _text(buf, code, pos, end)
    stop = _skip_value(buf, pos, end, 1)
    if code in (FMT_VBIN8, FMT_VBIN32):
        return buf[pos + (2 if code == FMT_VBIN8 else 5):stop], stop
    if code == FMT_NULL:
        return None, stop
    if code in (FMT_TRUE, FMT_FALSE):
        return code == FMT_TRUE, stop
    if code == FMT_BOOLEAN:
        return buf[pos + 1] != 0, stop
    if code in (0x43, 0x44):
        return 0, stop
    st = _SIMPLE.get(code)
    if st is not None:
        return st.unpack_from(buf, pos + 1)[0], stop
    if code == FMT_CHAR:
        cp = _U32.unpack_from(buf, pos + 1)[0]
        return (chr(cp) if cp <= 0x10FFFF else "\ufffd"), stop
    if code == FMT_UUID:
        return uuid.UUID(bytes=buf[pos + 1:stop]), stop
    return buf[pos:stop], stop            # decimals, lists, maps, arrays, described: as encoded


def _read_properties(buf, pos, end):
    """``(content_type, creation_time, end)`` of the properties list at ``pos``."""
    code = buf[pos]
    stop = _skip_value(buf, pos, end, 0)           # checks the whole list first
    content_type = creation_time = None
    if code == FMT_LIST0:
        return None, None, stop
    p, count, _ = _compound_frame(buf, code, pos + 1, end)
    for i in range(min(count, PROPERTY_CREATION_TIME + 1)):
        field = buf[p]
        if i == PROPERTY_CONTENT_TYPE and field in STRINGS:
            content_type = _text(buf, field, p, stop)[0]
        elif i == PROPERTY_CREATION_TIME and field == FMT_TIMESTAMP:
            creation_time = _I64.unpack_from(buf, p + 1)[0]
        p = _skip_value(buf, p, stop, 1)
    return content_type, creation_time, stop


def _read_app_properties(buf, pos, end):
    """``(dict, end)`` of the application-properties map at ``pos``."""
    stop = _skip_value(buf, pos, end, 0)
    p, count, _ = _compound_frame(buf, buf[pos], pos + 1, end)
    out = {}
    for _ in range(count // 2):
        code = buf[p]
        if code not in STRINGS:
            raise _NotAmqp
        key, p = _text(buf, code, p, stop)
        out[key], p = _property_value(buf, p, stop)
    return out, stop


def _section(buf, pos, end):
    """``(section code, position of its value)`` at ``pos``. Raises _NotAmqp."""
    if pos + 2 > end or buf[pos] != FMT_DESCRIBED:
        raise _NotAmqp
    form = buf[pos + 1]
    if form == FMT_SMALLULONG:
        if pos + LEN_DESCRIPTOR > end:
            raise _NotAmqp
        code, p = buf[pos + 2], pos + LEN_DESCRIPTOR
    elif form == FMT_ULONG:
        if pos + LEN_LONG_DESCRIPTOR > end:
            raise _NotAmqp
        code, p = _U64.unpack_from(buf, pos + 2)[0], pos + LEN_LONG_DESCRIPTOR
    elif form in (FMT_SYM8, FMT_SYM32):
        p = _skip_body(buf, form, pos + 2, end, 0)
        code = SECTION_NAMES.get(buf[pos + (3 if form == FMT_SYM8 else 6):p], 0)
    else:
        raise _NotAmqp
    if not SECTION_HEADER <= code <= SECTION_FOOTER or p >= end:
        raise _NotAmqp
    return code, p


# Stage of the section walk after each section; a section may only follow a lower stage (data and
# amqp-sequence sections may repeat, each only after its own kind).
_STAGE = {SECTION_HEADER: 1, SECTION_DELIVERY_ANNOTATIONS: 2, SECTION_MESSAGE_ANNOTATIONS: 3,
          SECTION_PROPERTIES: 4, SECTION_APP_PROPERTIES: 5, SECTION_DATA: 6, SECTION_AMQP_SEQUENCE: 6,
          SECTION_AMQP_VALUE: 6, SECTION_FOOTER: 7}


def decode_message(buf):
    """Read one record as an AMQP 1.0 message, or None when it is not a complete one.

    ``buf`` is any bytes-like object. Returns
    ``(content_type, creation_time, app_properties, sections, body_kind)``:

    * ``content_type``: str (properties field 6 when it is a symbol or string) or None.
    * ``creation_time``: int, ms since the Unix epoch (properties field 9 when it is a timestamp), or None.
    * ``app_properties``: dict, or None when the message has no application-properties section. Keys are
      str. Values: string and symbol -> str, binary -> bytes, null -> None, booleans -> bool, every
      integer type and timestamp -> int, float and double -> float, char -> a one-character str (U+FFFD
      past U+10FFFF), uuid -> uuid.UUID; decimals, lists, maps, arrays and described values -> bytes,
      their complete AMQP encoding (constructor included).
    * ``sections``: list of bytes, per ``body_kind``: BODY_DATA, the data sections' binaries in order
      (empty ones kept); BODY_VALUE_BINARY, ``[the binary]``; BODY_VALUE_STRING, ``[the string's UTF-8
      bytes as stored]``; BODY_VALUE (an amqp-value of any other type), ``[its complete AMQP
      encoding]``; BODY_SEQUENCE, the complete AMQP encoding of each amqp-sequence's list.

    None is the answer, never an exception, for any bytes that are not a complete message (see the
    module docstring for the rules). Pure; thread-safe.
    """
    buf = buf if type(buf) is bytes else bytes(memoryview(buf))
    end = len(buf)
    content_type = creation_time = app_properties = None
    sections = []
    stage = 0
    body = 0
    pos = 0
    try:
        if not end:
            raise _NotAmqp
        while pos < end:
            code, p = _section(buf, pos, end)
            new = _STAGE[code]
            repeat = stage == 6 and ((code == SECTION_DATA and body == BODY_DATA)
                                     or (code == SECTION_AMQP_SEQUENCE and body == BODY_SEQUENCE))
            if new <= stage and not repeat:
                raise _NotAmqp
            if code == SECTION_FOOTER and stage != 6:
                raise _NotAmqp
            stage = new
            value = buf[p]
            if code == SECTION_DATA:
                if value not in (FMT_VBIN8, FMT_VBIN32):
                    raise _NotAmqp
                pos = _skip_body(buf, value, p + 1, end, 0)
                sections.append(buf[p + (2 if value == FMT_VBIN8 else 5):pos])
                body = BODY_DATA
            elif code == SECTION_AMQP_VALUE:
                pos = _skip_value(buf, p, end, 0)
                if value in (FMT_VBIN8, FMT_VBIN32):
                    sections.append(buf[p + (2 if value == FMT_VBIN8 else 5):pos])
                    body = BODY_VALUE_BINARY
                elif value in STRINGS:
                    sections.append(buf[p + (2 if value & 0xF0 == 0xA0 else 5):pos])
                    body = BODY_VALUE_STRING
                else:
                    sections.append(buf[p:pos])
                    body = BODY_VALUE
            elif code in (SECTION_HEADER, SECTION_AMQP_SEQUENCE):
                if value not in LISTS:
                    raise _NotAmqp
                pos = _skip_value(buf, p, end, 0)
                if code == SECTION_AMQP_SEQUENCE:
                    sections.append(buf[p:pos])
                    body = BODY_SEQUENCE
            elif code == SECTION_PROPERTIES:
                if value not in LISTS:
                    raise _NotAmqp
                content_type, creation_time, pos = _read_properties(buf, p, end)
            elif code == SECTION_APP_PROPERTIES:
                if value not in MAPS:
                    raise _NotAmqp
                app_properties, pos = _read_app_properties(buf, p, end)
            else:                                   # annotations and footer
                if value not in MAPS:
                    raise _NotAmqp
                pos = _skip_value(buf, p, end, 0)
        if stage < 6:
            raise _NotAmqp                          # no body
    except _NotAmqp:
        return None
    return content_type, creation_time, app_properties, sections, body


# ---- payload sniffing ----------------------------------------------------------------------------------

def payload_kind(buf):
    """What a payload with no telling content-type is: KIND_JSON, KIND_BSON or KIND_BYTES.

    KIND_JSON: the bytes are UTF-8 text holding one complete JSON object (``{...}``, surrounded by JSON
    whitespace at most; NaN and Infinity are not JSON). KIND_BSON: the framing of one BSON document
    (int32 little-endian length equal to the payload's length, at least 5, last byte 0x00); the caller
    confirms by decoding it. KIND_BYTES: anything else. Never raises for a bytes-like ``buf``; pure;
    thread-safe.
    """
    data = buf if type(buf) is bytes else bytes(memoryview(buf))
    text = data.strip(_JSON_SPACE)
    if text[:1] == b"{" and text[-1:] == b"}":
        try:
            JSON_DECODER.decode(data.decode("utf-8"))
            return KIND_JSON
        except (ValueError, RecursionError):
            pass
    n = len(data)
    if n >= _LEN_BSON_MIN and _I32LE.unpack_from(data, 0)[0] == n and data[-1] == 0:
        return KIND_BSON
    return KIND_BYTES

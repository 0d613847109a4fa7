"""Kafka records <-> the one record format (DESIGN.md, "One record format").

A Kafka record is stored as an AMQP 1.0 bare message: the value as one data section (content-type
``application/octet-stream``, so readers sniff JSON and BSON in it as in any raw payload), the headers
as application properties (a value that is UTF-8 text as a string, else as binary; a null value as an
empty binary), the key as the message annotation ``x-key`` (binary), the timestamp as creation-time.

A stored record reaches a Kafka consumer with its payload as the value (JSON as its text, BSON as its
bytes, one data section as it is, a raw record whole), its application properties as headers (strings as
UTF-8, binaries as they are, other values as their text), and as key the ``x-key`` annotation, else the
``pkey`` application property (the WebSocket shell's partition key), else none. The timestamp is the
creation-time, else the chunk's timestamp.

Pure functions; thread-safe.
"""

import struct

from riverbed.engine import core
from riverbed.engine.record import CT_OCTET, encode_record

ANNOTATION_KEY = b"x-key"
PKEY = "pkey"
# the message-annotations section: descriptor 0x72 (small ulong), then a map32
_MA_HEAD = b"\x00\x53\x72\xd1"
_U32 = struct.Struct(">I")
_SECTION_MA = 0x72
_SECTION_HEADER = 0x70
_SECTION_DA = 0x71


def to_stored(key, value, headers, timestamp):
    """The stored form (bytes) of one Kafka record: ``key``/``value`` bytes or None, ``headers`` a list
    of (str, bytes or None), ``timestamp`` ms since the epoch (a negative one is not stored)."""
    props = None
    if headers:
        props = {}
        for name, val in headers:
            if val is None:
                props[name] = b""
                continue
            try:
                props[name] = val.decode("utf-8")
            except UnicodeDecodeError:
                props[name] = bytes(val)
    body = encode_record(value if value is not None else b"", CT_OCTET,
                         timestamp if timestamp is not None and timestamp >= 0 else None, props)
    if key is None:
        return body
    # map32: size counts the count field and the elements; count is 2 (one key, one value)
    elems = b"\xa3" + bytes((len(ANNOTATION_KEY),)) + ANNOTATION_KEY + b"\xb0" + _U32.pack(len(key)) + bytes(key)
    return _MA_HEAD + _U32.pack(4 + len(elems)) + _U32.pack(2) + elems + body


def from_stored(raw, chunk_ts):
    """A stored record as a Kafka record: (timestamp ms, key, value, headers). Never raises for
    bytes-like input (a record that is not AMQP is a raw payload)."""
    # the payload is all a Kafka consumer gets: what kind it is (JSON, BSON) does not matter here, so the
    # core's message decoder is enough (decode_record would sniff the payload too)
    msg = core.decode_message(raw)
    if msg is None:
        return chunk_ts, None, raw if type(raw) is bytes else bytes(raw), []
    _ctype, creation_time, props, sections, _body = msg
    key = _annotation_key(raw)
    headers = []
    for name, val in (props or {}).items():
        if isinstance(val, str):
            val = val.encode("utf-8")
        elif not isinstance(val, (bytes, bytearray)):
            val = str(val).encode("utf-8")
        headers.append((str(name), bytes(val)))
        if key is None and name == PKEY:
            key = bytes(val)
    payload = sections[0] if len(sections) == 1 else b"".join(sections)
    return (creation_time if creation_time is not None else chunk_ts), key, payload, headers


# ---- reading the x-key annotation: just enough of AMQP 1.0's encoding to walk to it ----------------------

def _skip(buf, pos):
    """The position after the AMQP value at ``pos``. Raises IndexError/ValueError on bad data."""
    c = buf[pos]
    pos += 1
    if c == 0x00:                           # described: descriptor, then the value
        return _skip(buf, _skip(buf, pos))
    hi = c & 0xF0
    if hi == 0x40:
        return pos
    if hi == 0x50:
        return pos + 1
    if hi == 0x60:
        return pos + 2
    if hi == 0x70:
        return pos + 4
    if hi == 0x80:
        return pos + 8
    if hi == 0x90:
        return pos + 16
    if hi in (0xA0, 0xC0, 0xE0):
        return pos + 1 + buf[pos]
    if hi in (0xB0, 0xD0, 0xF0):
        return pos + 4 + _U32.unpack_from(buf, pos)[0]
    raise ValueError("bad AMQP constructor")


def _descriptor(buf, pos):
    if buf[pos] != 0x00:
        return None
    if buf[pos + 1] == 0x53:
        return buf[pos + 2]
    if buf[pos + 1] == 0x80:
        return _U32.unpack_from(buf, pos + 6)[0] if buf[pos + 2:pos + 6] == b"\0\0\0\0" else None
    return None


_OWN_KEY = b"\xa3\x05x-key\xb0"      # the map this module writes: x-key first, a vbin32 value


def _annotation_key(raw):
    if raw[:4] == _MA_HEAD and raw[12:20] == _OWN_KEY and len(raw) >= 24:
        n = _U32.unpack_from(raw, 20)[0]        # the layout to_stored writes: no walk needed
        if 24 + n <= len(raw):
            return bytes(raw[24:24 + n])
    try:
        pos = 0
        n = len(raw)
        while pos < n:
            d = _descriptor(raw, pos)
            if d in (_SECTION_HEADER, _SECTION_DA):
                pos = _skip(raw, pos)
                continue
            if d != _SECTION_MA:
                return None
            value = pos + (3 if raw[pos + 1] == 0x53 else 10)
            return _map_lookup(raw, value, _skip(raw, value))
    except (IndexError, ValueError, struct.error):
        return None
    return None


def _map_lookup(raw, pos, end):
    c = raw[pos]
    if c == 0xC1:
        count, pos = raw[pos + 2], pos + 3
    elif c == 0xD1:
        count, pos = _U32.unpack_from(raw, pos + 5)[0], pos + 9
    else:
        return None
    for _ in range(count // 2):
        k_end = _skip(raw, pos)
        key = None
        if raw[pos] == 0xA3:
            key = bytes(raw[pos + 2:k_end])
        elif raw[pos] == 0xB3:
            key = bytes(raw[pos + 5:k_end])
        v_end = _skip(raw, k_end)
        if key == ANNOTATION_KEY:
            t = raw[k_end]
            if t in (0xA0, 0xA1):
                return bytes(raw[k_end + 2:v_end])
            if t in (0xB0, 0xB1):
                return bytes(raw[k_end + 5:v_end])
            return None
        pos = v_end
        if pos > end:
            return None
    return None

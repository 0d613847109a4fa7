"""Byte encodings of the document store: document ids, index values, and the keys built from them.

See :mod:`riverbed.engine.docstore` for the LMDB layout these keys live in. Everything here is pure
(no state) and thread-safe.

Document ids (``id_key``), 9 bytes for an int, 1 + n for a string; ints sort before strings::

    int    0x10 | (id + 2**63) u64 BE           ids are -2**63 .. 2**63-1 (BSON int64), numeric order
    str    0x20 | UTF-8 (1..255 bytes)          byte order = code point order

Index values (``value_key``): order-preserving and self-delimiting (no key is a prefix of another), so
``index prefix | value key | id key`` sorts by value, then id. Type order: null < numbers < strings <
booleans (values of other types are not indexed)::

    null     0x05
    number   0x10 | F (8 bytes) | n (1 byte) | E (n bytes, big-endian)
             F is the largest double <= the number, as 8 order-preserving bytes (IEEE-754 big-endian
             with the sign bit set for positives and every bit flipped for negatives; -0.0 is 0.0);
             E = number - F, an integer >= 0 in minimal bytes (n = 0 for every double and every int
             within 2**53; at most 2 bytes for an int64). ints and floats compare as numbers
             (1 < 1.5 < 2, 2**53 + 1 > float(2**53)) and never collide. NaN is not indexed.
    string   0x20 | UTF-8 with 0x00 written 0x00 0xFF | 0x00 0x00
             a string over STRING_CUT (120) bytes of UTF-8 keeps its first 120 bytes and ends
             0x00 0x01 instead: still ordered, but several long strings can share one key, so a
             lookup re-checks the documents (and a unique check compares the stored values).
    boolean  0x30 | 0x00 (false) or 0x01 (true)

The widest index key is 4 + 1 + 243 + 256 = 504 bytes, under LMDB's 511-byte key limit.
"""

import math
import struct

from riverbed.engine.errors import InvalidArgument

MAX_NAME = 255          # bytes of UTF-8 in a collection name
MAX_STR_ID = 255        # bytes of UTF-8 in a string id
INT_ID_MIN = -(1 << 63)
INT_ID_MAX = (1 << 63) - 1
STRING_CUT = 120        # bytes of UTF-8 kept in a string index key

ID_INT = 0x10
ID_STR = 0x20
T_NULL = 0x05
T_NUM = 0x10
T_STR = 0x20
T_BOOL = 0x30

KEY_NULL = b"\x05"
KEY_FALSE = b"\x30\x00"
KEY_TRUE = b"\x30\x01"
# [start, stop) of every value key of one type, for range scans
BRACKETS = {T_NULL: (b"\x05", b"\x06"), T_NUM: (b"\x10", b"\x11"), T_STR: (b"\x20", b"\x21"),
            T_BOOL: (b"\x30", b"\x31")}
HIGH = b"\xff"          # value key + HIGH is above every index key holding that value key

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_F64 = struct.Struct(">d")
_BIAS = 1 << 63
_MASK = (1 << 64) - 1
_EXACT = 1 << 53        # every int within +-2**53 is a double


def check_name(name, what="collection name"):
    """``name`` as UTF-8 bytes; InvalidArgument unless it is a str of 1..255 bytes of UTF-8."""
    if not isinstance(name, str):
        raise InvalidArgument(f"{what} must be a str, not {type(name).__name__}")
    try:
        b = name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} {name!r} is not valid UTF-8") from None
    if not 0 < len(b) <= MAX_NAME:
        raise InvalidArgument(f"{what} must be 1..{MAX_NAME} bytes of UTF-8, not {len(b)}")
    return b


def id_key(doc_id):
    """The key bytes of a document id: an int in -2**63..2**63-1 or a str of 1..255 bytes of UTF-8.
    Raises InvalidArgument for anything else (bools, floats, None, ...)."""
    if type(doc_id) is int or isinstance(doc_id, int) and not isinstance(doc_id, bool):
        if INT_ID_MIN <= doc_id <= INT_ID_MAX:
            return b"\x10" + _U64.pack(doc_id + _BIAS)
        raise InvalidArgument(f"integer id {doc_id} is outside the int64 range")
    if isinstance(doc_id, str):
        try:
            b = doc_id.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"id {doc_id!r} is not valid UTF-8") from None
        if 0 < len(b) <= MAX_STR_ID:
            return b"\x20" + b
        raise InvalidArgument(f"a string id must be 1..{MAX_STR_ID} bytes of UTF-8, not {len(b)}")
    raise InvalidArgument(f"a document id must be an int or a str, not {type(doc_id).__name__}")


def id_from_key(key):
    """The id (int or str) of key bytes made by :func:`id_key` (any bytes-like)."""
    tag = key[0]
    if tag == ID_INT:
        return _U64.unpack_from(key, 1)[0] - _BIAS
    if tag == ID_STR:
        return bytes(key[1:]).decode("utf-8")
    raise ValueError(f"not a document id key: {bytes(key)[:16].hex()}")


def _f64_key(f):
    u = _U64.unpack(_F64.pack(f))[0]
    return _U64.pack((~u & _MASK) if u >> 63 else (u | _BIAS))


def number_key(x):
    """Value key of an int or float, or None when it has none (NaN, or an int beyond the double range)."""
    if isinstance(x, float):
        if x != x:
            return None
        return b"\x10" + _f64_key(x + 0.0) + b"\x00"          # x + 0.0 turns -0.0 into 0.0
    if -_EXACT <= x <= _EXACT:
        return b"\x10" + _f64_key(float(x) + 0.0) + b"\x00"
    try:
        f = float(x)
    except OverflowError:
        return None
    if f > x:                                   # exact int/float comparison: round down, not to nearest
        f = math.nextafter(f, -math.inf)
    if math.isinf(f):
        return None
    extra = x - int(f)
    eb = extra.to_bytes((extra.bit_length() + 7) >> 3, "big")
    return b"\x10" + _f64_key(f) + bytes((len(eb),)) + eb


def string_key(s):
    """Value key of a str (None when it is not encodable as UTF-8: no stored string can equal it)."""
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return string_bytes_key(b)


def string_bytes_key(b):
    """Value key of the string whose UTF-8 bytes are ``b``."""
    if len(b) <= STRING_CUT:
        return b"\x20" + b.replace(b"\x00", b"\x00\xff") + b"\x00\x00"
    return b"\x20" + b[:STRING_CUT].replace(b"\x00", b"\x00\xff") + b"\x00\x01"


def value_key(v):
    """Value key of an indexable value (None, bool, int, float, str), or None when ``v`` has none:
    ``Ellipsis`` (what :func:`core.bson_values` gives for a missing field or another type), NaN, other
    types. Index entries are written for values with a key only."""
    if v is None:
        return KEY_NULL
    t = type(v)
    if t is bool:
        return KEY_TRUE if v else KEY_FALSE
    if t is str:
        return string_key(v)
    if t is int or t is float:
        return number_key(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return number_key(v)
    return None


def is_truncated(vkey):
    """Whether a value key stands for several strings (a long string cut at STRING_CUT bytes)."""
    return vkey[0] == T_STR and vkey[-1] == 1


def value_key_len(key, pos):
    """Length of the value key that starts at ``pos`` of ``key`` (bytes). ValueError when malformed."""
    tag = key[pos]
    if tag == T_NULL:
        return 1
    if tag == T_BOOL:
        return 2
    if tag == T_NUM:
        return 10 + key[pos + 9]
    if tag == T_STR:
        i = pos + 1
        while True:
            i = key.index(b"\x00", i)
            if key[i + 1] != 0xFF:
                return i + 2 - pos
            i += 2
    raise ValueError(f"bad value key tag 0x{tag:02x}")


def decode_value_key(vkey):
    """The value a (non-truncated) value key stands for; a truncated string key gives its prefix + '...'
    (for display only)."""
    tag = vkey[0]
    if tag == T_NULL:
        return None
    if tag == T_BOOL:
        return vkey[1] == 1
    if tag == T_STR:
        s = vkey[1:-2].replace(b"\x00\xff", b"\x00").decode("utf-8", "replace")
        return s + "..." if vkey[-1] == 1 else s
    if tag == T_NUM:
        u = _U64.unpack_from(vkey, 1)[0]
        u = (u & ~_BIAS) if u >> 63 else (~u & _MASK)
        f = _F64.unpack(_U64.pack(u))[0]
        n = vkey[9]
        if n == 0:
            return f
        return int(f) + int.from_bytes(vkey[10:10 + n], "big")
    raise ValueError(f"bad value key tag 0x{tag:02x}")


def bracket_of(vkey):
    """[start, stop) of all value keys of the same type as ``vkey``."""
    return BRACKETS[vkey[0]]


def u32(n):
    return _U32.pack(n)


def u64(n):
    return _U64.pack(n)


def read_u32(b):
    return _U32.unpack(b)[0]


def read_u64(b):
    return _U64.unpack(b)[0]

"""Pure-Python twin of the document part of the compiled core (``docs.pxi``): predicates evaluated over
raw BSON bytes, and index values read out of raw BSON, without decoding the document.

Same names, same results, same errors in both twins; these docstrings are the spec. Re-exported by
:mod:`riverbed.engine._pycore` and picked through :mod:`riverbed.engine.core`. Pure and thread-safe.

Finding a field. A path is a tuple of components (bytes, UTF-8). Each component is looked up among the
elements of the current document by exact key bytes; the first element with that key wins. Every
component but the last must land on an embedded document (0x03) or an array (0x04, whose keys are
``"0"``, ``"1"``, ...), else the field is missing. Elements are walked with bounds checks: a document
whose lengths do not add up is *malformed*.

Kinds of BSON element types (as :func:`riverbed.engine.predicate.kind_of` sees the decoded value)::

    null     0x0A null, 0x06 undefined (pymongo decodes both to None)
    number   0x01 double, 0x10 int32, 0x12 int64
    string   0x02 string, 0x0E symbol (decoded to str)
    boolean  0x08
    other    every other type (documents, arrays, binary, ObjectId, datetime, regex, code, decimal128...)

Program (nested tuples, made by :func:`riverbed.engine.predicate.raw_program`)::

    (OP_TRUE,)  (OP_FALSE,)
    (OP_AND, (program, ...))        (OP_OR, (program, ...))         (OP_NOT, program)
    (OP_CMP, path, cmp, literal)    cmp: CMP_EQ 0, CMP_LT 1, CMP_LE 2, CMP_GT 3, CMP_GE 4; literal: None,
                                    bool, int (int64 range), float, or bytes (a UTF-8 string)
    (OP_EXISTS, path)               (OP_CONTAINS, path, needle bytes)
    (OP_REGEX, path, pattern)       pattern: a compiled ``re`` pattern (its ``search`` is called)
    (OP_UNSURE, path, kinds)        "ask Python": false when the field is missing or its kind is not
                                    in the bit set ``kinds`` (K_NULL 1, K_NUM 2, K_STR 4, K_BOOL 8,
                                    K_OTHER 16), unknown otherwise

Results are three-valued: 1 (match), 0 (no match), -1 (unknown: the caller decodes the document and
evaluates the predicate in Python). OP_CMP on a missing field, or on a field of another kind than the
literal, is 0. Numbers compare exactly across int and double (NaN: every comparison 0); strings by
bytes (memcmp, then length); booleans False < True; a null literal matches a null field for EQ, LE and
GE only. OP_CONTAINS is 1 when the field is a string holding the needle. OP_REGEX is 1 when the field is
a string and ``pattern.search`` finds a match in it. And/Or/Not use Kleene logic (0 wins an And, 1 wins
an Or, Not keeps -1). A malformed document gives -1 for every node that looks into it.
"""

import struct

from riverbed.engine.dockeys import KEY_FALSE, KEY_NULL, KEY_TRUE, number_key, string_bytes_key
from riverbed.engine.predicate import (
    CMP_EQ, CMP_GE, CMP_GT, CMP_LE, CMP_LT, K_BOOL, K_NULL, K_NUM, K_OTHER, K_STR, OP_AND, OP_CMP,
    OP_CONTAINS, OP_EXISTS, OP_FALSE, OP_NOT, OP_OR, OP_REGEX, OP_TRUE, OP_UNSURE,
)

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")

_KIND = {0x0A: K_NULL, 0x06: K_NULL, 0x01: K_NUM, 0x10: K_NUM, 0x12: K_NUM, 0x02: K_STR, 0x0E: K_STR,
         0x08: K_BOOL}
_FIXED = {0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16,
          0xFF: 0, 0x7F: 0}


class Malformed(Exception):
    """Internal: the document's lengths do not add up."""


def _value_size(t, b, pos, end):
    """Bytes taken by a value of BSON type ``t`` at ``pos`` (the element must end by ``end``)."""
    n = _FIXED.get(t)
    if n is not None:
        pass
    elif t in (0x02, 0x0D, 0x0E):
        if end - pos < 4:
            raise Malformed
        s = _I32.unpack_from(b, pos)[0]
        if s < 1 or s > end - pos - 4:
            raise Malformed
        n = 4 + s
    elif t in (0x03, 0x04, 0x0F):
        if end - pos < 5:
            raise Malformed
        n = _I32.unpack_from(b, pos)[0]
        if n < 5:
            raise Malformed
    elif t == 0x05:
        if end - pos < 5:
            raise Malformed
        n = 5 + _I32.unpack_from(b, pos)[0]
        if n < 5:
            raise Malformed
    elif t == 0x0B:
        i = b.find(b"\x00", pos, end)
        if i < 0:
            raise Malformed
        i = b.find(b"\x00", i + 1, end)
        if i < 0:
            raise Malformed
        n = i + 1 - pos
    elif t == 0x0C:
        if end - pos < 4:
            raise Malformed
        s = _I32.unpack_from(b, pos)[0]
        if s < 1:
            raise Malformed
        n = 4 + s + 12
    else:
        raise Malformed
    if n > end - pos:
        raise Malformed
    return n


def _find(b, path):
    """``(type, value start, value size)`` of the field at ``path`` in BSON bytes ``b``, or None when it
    is missing. Raises Malformed."""
    start, length = 0, len(b)
    last = len(path) - 1
    for depth, part in enumerate(path):
        if length < 5:
            raise Malformed
        dlen = _I32.unpack_from(b, start)[0]
        if dlen < 5 or dlen > length:
            raise Malformed
        end = start + dlen - 1          # the document's trailing NUL
        pos = start + 4
        hit = None
        while pos < end:
            t = b[pos]
            k = b.find(b"\x00", pos + 1, end)
            if k < 0:
                raise Malformed
            vs = k + 1
            size = _value_size(t, b, vs, end)
            if k - pos - 1 == len(part) and b[pos + 1:k] == part:
                hit = (t, vs, size)
                break
            pos = vs + size
        if hit is None:
            return None
        if depth == last:
            return hit
        if hit[0] not in (0x03, 0x04):
            return None
        start, length = hit[1], hit[2]
    return None


def _number(t, b, pos):
    if t == 0x01:
        return _F64.unpack_from(b, pos)[0]
    if t == 0x10:
        return _I32.unpack_from(b, pos)[0]
    return _I64.unpack_from(b, pos)[0]


def _string(b, pos):
    n = _I32.unpack_from(b, pos)[0]
    return b[pos + 4:pos + 3 + n]


def _cmp_result(s, cmp):
    # s: -1, 0, 1 (field vs literal) or 2 (unordered)
    if s == 2:
        return 0
    if cmp == CMP_EQ:
        return int(s == 0)
    if cmp == CMP_LT:
        return int(s < 0)
    if cmp == CMP_LE:
        return int(s <= 0)
    if cmp == CMP_GT:
        return int(s > 0)
    return int(s >= 0)


def _sign(a, b):
    if a != a or b != b:
        return 2
    return -1 if a < b else (1 if a > b else 0)


class DocMatcher:
    """A predicate program (see the module docstring) ready to run over raw BSON documents. Raises
    ValueError for a malformed program (also one nested over 500 deep). Immutable once built; ``match``
    may run on any thread."""

    def __init__(self, program):
        _check_program(program)
        self.program = program

    def match(self, raw):
        """1, 0 or -1 (unknown) for the BSON document ``raw`` (any bytes-like)."""
        return _eval(self.program, bytes(raw))


MAX_DEPTH = 500


def _check_program(p, depth=0):
    if depth > MAX_DEPTH:
        raise ValueError("matcher program nested too deeply")
    if type(p) is not tuple or not p or type(p[0]) is not int:
        raise ValueError(f"bad matcher program node {p!r}")
    op = p[0]
    if op in (OP_TRUE, OP_FALSE) and len(p) == 1:
        return
    if op in (OP_AND, OP_OR) and len(p) == 2 and type(p[1]) is tuple:
        for c in p[1]:
            _check_program(c, depth + 1)
        return
    if op == OP_NOT and len(p) == 2:
        _check_program(p[1], depth + 1)
        return
    if op in (OP_CMP, OP_EXISTS, OP_CONTAINS, OP_REGEX, OP_UNSURE):
        path = p[1] if len(p) > 1 else None
        if type(path) is not tuple or not path or not all(type(c) is bytes for c in path):
            raise ValueError(f"bad path in matcher program node {p!r}")
        if op == OP_CMP and len(p) == 4 and type(p[2]) is int and CMP_EQ <= p[2] <= CMP_GE:
            lit = p[3]
            if lit is None or type(lit) in (bool, float, bytes) or (
                    type(lit) is int and -(1 << 63) <= lit < (1 << 63)):
                return
        if op == OP_EXISTS and len(p) == 2:
            return
        if op == OP_CONTAINS and len(p) == 3 and type(p[2]) is bytes:
            return
        if op == OP_REGEX and len(p) == 3 and hasattr(p[2], "search"):
            return
        if op == OP_UNSURE and len(p) == 3 and type(p[2]) is int:
            return
    raise ValueError(f"bad matcher program node {p!r}")


def _eval(p, b):
    op = p[0]
    if op == OP_TRUE:
        return 1
    if op == OP_FALSE:
        return 0
    if op == OP_AND:
        res = 1
        for c in p[1]:
            r = _eval(c, b)
            if r == 0:
                return 0
            if r < 0:
                res = -1
        return res
    if op == OP_OR:
        res = 0
        for c in p[1]:
            r = _eval(c, b)
            if r == 1:
                return 1
            if r < 0:
                res = -1
        return res
    if op == OP_NOT:
        r = _eval(p[1], b)
        return r if r < 0 else 1 - r
    try:
        hit = _find(b, p[1])
    except Malformed:
        return -1
    if op == OP_EXISTS:
        return int(hit is not None)
    if hit is None:
        return 0
    t, pos, _ = hit
    kind = _KIND.get(t, K_OTHER)
    if op == OP_CMP:
        cmp, lit = p[2], p[3]
        if lit is None:
            return int(kind == K_NULL and cmp in (CMP_EQ, CMP_LE, CMP_GE))
        if type(lit) is bool:
            if kind != K_BOOL:
                return 0
            return _cmp_result(_sign(b[pos] != 0, lit), cmp)
        if type(lit) is bytes:
            if kind != K_STR:
                return 0
            return _cmp_result(_sign(_string(b, pos), lit), cmp)
        if kind != K_NUM:
            return 0
        return _cmp_result(_sign(_number(t, b, pos), lit), cmp)   # Python compares int/float exactly
    if op == OP_CONTAINS:
        return int(kind == K_STR and p[2] in _string(b, pos))
    if op == OP_REGEX:
        if kind != K_STR:
            return 0
        try:
            s = _string(b, pos).decode("utf-8")
        except UnicodeDecodeError:
            return -1
        return int(p[2].search(s) is not None)
    # OP_UNSURE
    return -1 if kind & p[2] else 0


def _check_path(path):
    if len(path) > 64:
        raise ValueError("a path has at most 64 components")
    for part in path:
        if type(part) is not bytes:
            raise TypeError("path components must be bytes")


def bson_values(raw, paths):
    """The values at each of ``paths`` (tuples of bytes components) of the BSON document ``raw``, as a
    list: None for null/undefined, bool, int (int32/int64), float (double), str (string/symbol; invalid
    UTF-8 raises UnicodeDecodeError), and Ellipsis for a missing field or any other type. A path has
    at most 64 components (ValueError), each bytes (TypeError). Raises ValueError when the document is
    malformed."""
    b = bytes(raw)
    out = []
    for path in paths:
        _check_path(path)
        try:
            hit = _find(b, path)
        except Malformed:
            raise ValueError("malformed BSON document") from None
        if hit is None:
            out.append(...)
            continue
        t, pos, _ = hit
        if t == 0x0A or t == 0x06:
            out.append(None)
        elif t == 0x08:
            out.append(b[pos] != 0)
        elif t in (0x01, 0x10, 0x12):
            out.append(_number(t, b, pos))
        elif t in (0x02, 0x0E):
            out.append(_string(b, pos).decode("utf-8"))
        else:
            out.append(...)
    return out




def bson_index_keys(raw, paths):
    """The index value keys (:func:`riverbed.engine.dockeys.value_key`) of the values at each of
    ``paths`` of the BSON document ``raw``, computed from the raw bytes (strings are not UTF-8 checked):
    a list of bytes, or None for a missing field, NaN, or a type with no key. A path has at most 64
    components. Raises ValueError when the document is malformed or a path is too long."""
    b = bytes(raw)
    out = []
    for path in paths:
        _check_path(path)
        try:
            hit = _find(b, path)
        except Malformed:
            raise ValueError("malformed BSON document") from None
        if hit is None:
            out.append(None)
            continue
        t, pos, _ = hit
        if t == 0x0A or t == 0x06:
            out.append(KEY_NULL)
        elif t == 0x08:
            out.append(KEY_TRUE if b[pos] else KEY_FALSE)
        elif t in (0x01, 0x10, 0x12):
            out.append(number_key(_number(t, b, pos)))
        elif t in (0x02, 0x0E):
            out.append(string_bytes_key(_string(b, pos)))
        else:
            out.append(None)
    return out


__all__ = ["DocMatcher", "bson_values", "bson_index_keys"]

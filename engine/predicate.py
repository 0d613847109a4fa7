"""One predicate tree for the document store: mewbase matchers (MongoDB query syntax) and REAM expressions
both compile to these nodes, and the store evaluates them with indexes where it can.

Nodes (immutable; ``path`` is a dotted field path such as ``"address.city"``; a numeric component such
as ``"tags.0"`` indexes a list)::

    Eq(path, value)     Ne(path, value)
    Lt(path, value)     Le(path, value)     Gt(path, value)     Ge(path, value)
    In(path, values)    Nin(path, values)   Exists(path, present=True)
    Regex(path, pattern, flags="")          Contains(path, substring)
    And(children)       Or(children)        Not(child)          Always()   (TRUE is the instance)

Semantics (the store's index lookups, its compiled raw-BSON matcher and :func:`compile_predicate` agree
on every document; the tests check it):

- Values have a kind: null (None), number (int or float, not bool), string (str, not bson.Code),
  boolean, or other (embedded documents, lists, bytes, datetimes, ObjectIds, ...).
- A missing field equals nothing and compares with nothing: Eq, Lt, Le, Gt, Ge, In, Regex and Contains
  are false on it; Ne and Nin are true on it (MongoDB's ``$ne``/``$nin``). ``Exists(p, False)`` matches it.
- Eq: same kind and equal. Numbers compare as numbers (1 == 1.0; NaN equals nothing). Embedded
  documents are equal when they hold the same keys in the same order with equal values (MongoDB's
  rule), lists when they have equal elements in order; booleans never equal numbers (True != 1).
  There is no array-element matching: ``Eq("tags", "a")`` does not match ``{"tags": ["a"]}``.
- Lt/Le/Gt/Ge: false across kinds (no exceptions). Numbers numerically, strings by code point (= UTF-8
  byte order), booleans False < True, null only equals null (so Le/Ge(p, None) match null). Other kinds
  compare when both values have the same type and Python can order them (datetimes, bytes); documents
  and lists never compare.
- Regex: the field is a string and ``re.search`` finds the pattern (unanchored); flags are MongoDB's
  ``$options`` letters ``i m s x``. Contains: the field is a string holding the substring.
- And/Or/Not as usual; several operators on one field in a MongoDB matcher are ANDed.

:func:`from_mongo` compiles a MongoDB-syntax matcher; :func:`raw_program` compiles a tree for the raw
BSON matcher (:class:`core.DocMatcher`, format in :mod:`riverbed.engine._pydocs`). All of this is pure
and thread-safe.
"""

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from bson.code import Code
from bson.regex import Regex as BsonRegex

from riverbed.engine.errors import InvalidArgument

__all__ = [
    "Node", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "In", "Nin", "Exists", "Regex", "Contains", "And", "Or", "Not",
    "Always", "TRUE", "MISSING", "K_NULL", "K_NUM", "K_STR", "K_BOOL", "K_OTHER", "kind_of", "get_path",
    "split_path", "compile_predicate", "matches", "from_mongo", "raw_program", "conjuncts",
]

# value kinds (bit flags: the raw matcher's UNSURE node takes a set of them)
K_NULL, K_NUM, K_STR, K_BOOL, K_OTHER = 1, 2, 4, 8, 16


class _Missing:
    __slots__ = ()

    def __repr__(self):
        return "MISSING"


MISSING = _Missing()
"""What :func:`get_path` returns for a field that is not there."""


def kind_of(v):
    """The kind (K_*) of a value."""
    if v is None:
        return K_NULL
    t = type(v)
    if t is str:
        return K_STR
    if t is int or t is float:
        return K_NUM
    if t is bool:
        return K_BOOL
    if isinstance(v, bool):
        return K_BOOL
    if isinstance(v, (int, float)):
        return K_NUM
    if isinstance(v, str) and not isinstance(v, Code):
        return K_STR
    return K_OTHER


@functools.lru_cache(maxsize=4096)
def split_path(path):
    """``"a.b.c"`` -> ``("a", "b", "c")``; InvalidArgument for a non-str, empty path or empty component."""
    if not isinstance(path, str) or not path:
        raise InvalidArgument(f"a field path must be a non-empty str, not {path!r}")
    parts = tuple(path.split("."))
    if "" in parts:
        raise InvalidArgument(f"field path {path!r} has an empty component")
    return parts


def _canonical_index(part):
    return part.isdigit() and part.isascii() and (part == "0" or part[0] != "0")


def get_path(doc, parts):
    """The value at ``parts`` (a tuple from split_path) in ``doc``, or MISSING. A component steps into a
    dict by key, or into a list/tuple when it is a canonical decimal index (``"0"``, ``"12"``)."""
    v = doc
    for p in parts:
        if isinstance(v, dict):
            v = v.get(p, MISSING)
            if v is MISSING:
                return MISSING
        elif isinstance(v, (list, tuple)) and _canonical_index(p):
            i = int(p)
            if i >= len(v):
                return MISSING
            v = v[i]
        else:
            return MISSING
    return v


def values_equal(a, b):
    """Equality of two present values under the store's rules (see the module docstring)."""
    ka = kind_of(a)
    if ka != kind_of(b):
        return False
    if ka != K_OTHER:
        return ka == K_NULL or a == b
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        for (k1, v1), (k2, v2) in zip(a.items(), b.items()):
            if k1 != k2 or not values_equal(v1, v2):
                return False
        return True
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return False
        return all(values_equal(x, y) for x, y in zip(a, b))
    if isinstance(b, (dict, list, tuple)):
        return False
    try:
        return (isinstance(a, type(b)) or isinstance(b, type(a))) and bool(a == b)
    except Exception:  # noqa: BLE001 - an odd type's __eq__: unequal
        return False


_LT, _LE, _GT, _GE = 1, 2, 3, 4


def compare(a, b, op):
    """Ordering comparison ``a <op> b`` of a present value ``a`` with ``b`` (op: 1 <, 2 <=, 3 >, 4 >=)."""
    ka = kind_of(a)
    if ka != kind_of(b):
        return False
    if ka == K_NULL:
        return op == _LE or op == _GE
    if ka == K_OTHER:
        if isinstance(a, (dict, list, tuple)) or type(a) is not type(b):
            return False
    try:
        if op == _LT:
            return bool(a < b)
        if op == _LE:
            return bool(a <= b)
        if op == _GT:
            return bool(a > b)
        return bool(a >= b)
    except Exception:  # noqa: BLE001 - unorderable values: false, never an exception
        return False


# ------------------------------------------------------------------------------------------------ nodes


class Node:
    """Base class of predicate nodes."""

    __slots__ = ()

    def __and__(self, other):
        return And((self, other))

    def __or__(self, other):
        return Or((self, other))

    def __invert__(self):
        return Not(self)


def _check_path(path):
    split_path(path)


@dataclass(frozen=True, eq=True, repr=True)
class _FieldNode(Node):
    path: str
    value: object

    def __post_init__(self):
        _check_path(self.path)


class Eq(_FieldNode):
    """The field holds a value equal to ``value``."""


class Ne(_FieldNode):
    """Not Eq: the field is missing or holds another value."""


class Lt(_FieldNode):
    """The field holds a value of the same kind, less than ``value``."""


class Le(_FieldNode):
    """The field holds a value of the same kind, less than or equal to ``value``."""


class Gt(_FieldNode):
    """The field holds a value of the same kind, greater than ``value``."""


class Ge(_FieldNode):
    """The field holds a value of the same kind, greater than or equal to ``value``."""


@dataclass(frozen=True, eq=True, repr=True)
class In(Node):
    """The field equals one of ``values`` (a tuple; a list is converted)."""
    path: str
    values: tuple

    def __post_init__(self):
        _check_path(self.path)
        if not isinstance(self.values, tuple):
            if isinstance(self.values, (str, bytes, Mapping)) or not hasattr(self.values, "__iter__"):
                raise InvalidArgument(f"In/Nin values must be a list or tuple, not {type(self.values).__name__}")
            object.__setattr__(self, "values", tuple(self.values))


class Nin(In):
    """Not In: the field is missing or equals none of ``values``."""


@dataclass(frozen=True, eq=True, repr=True)
class Exists(Node):
    """The field is present (``present=True``, null included) or missing (``present=False``)."""
    path: str
    present: bool = True

    def __post_init__(self):
        _check_path(self.path)
        object.__setattr__(self, "present", bool(self.present))


_REGEX_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}


@functools.lru_cache(maxsize=512)
def compile_regex(pattern, flags=""):
    """``re.compile`` of a pattern with MongoDB option letters; InvalidArgument when either is bad."""
    f = 0
    for c in flags:
        if c not in _REGEX_FLAGS:
            raise InvalidArgument(f"unsupported regex option {c!r} (supported: i, m, s, x)")
        f |= _REGEX_FLAGS[c]
    try:
        return re.compile(pattern, f)
    except re.error as e:
        raise InvalidArgument(f"bad regular expression {pattern!r}: {e}") from None


@dataclass(frozen=True, eq=True, repr=True)
class Regex(Node):
    """The field is a string in which ``pattern`` (Python ``re`` syntax) is found anywhere."""
    path: str
    pattern: str
    flags: str = ""

    def __post_init__(self):
        _check_path(self.path)
        if not isinstance(self.pattern, str) or not isinstance(self.flags, str):
            raise InvalidArgument("a regex pattern and its flags must be str")
        compile_regex(self.pattern, self.flags)

    @property
    def compiled(self):
        return compile_regex(self.pattern, self.flags)


@dataclass(frozen=True, eq=True, repr=True)
class Contains(Node):
    """The field is a string holding ``substring``."""
    path: str
    substring: str

    def __post_init__(self):
        _check_path(self.path)
        if not isinstance(self.substring, str):
            raise InvalidArgument("Contains needs a str substring")


def _children(children):
    if isinstance(children, Node):
        raise InvalidArgument("And/Or take a sequence of nodes")
    children = tuple(children)
    for c in children:
        if not isinstance(c, Node):
            raise InvalidArgument(f"not a predicate node: {c!r}")
    return children


@dataclass(frozen=True, eq=True, repr=True)
class And(Node):
    """All children match (an empty And matches everything)."""
    children: tuple

    def __post_init__(self):
        object.__setattr__(self, "children", _children(self.children))


@dataclass(frozen=True, eq=True, repr=True)
class Or(Node):
    """At least one child matches (an empty Or matches nothing)."""
    children: tuple

    def __post_init__(self):
        object.__setattr__(self, "children", _children(self.children))


@dataclass(frozen=True, eq=True, repr=True)
class Not(Node):
    """The child does not match."""
    child: Node

    def __post_init__(self):
        if not isinstance(self.child, Node):
            raise InvalidArgument(f"not a predicate node: {self.child!r}")


@dataclass(frozen=True, eq=True, repr=True)
class Always(Node):
    """Matches every document (an empty MongoDB matcher ``{}``)."""


TRUE = Always()


def conjuncts(node):
    """The And-flattened list of conjuncts of ``node`` (``[node]`` when it is not an And)."""
    if isinstance(node, And):
        out = []
        for c in node.children:
            out.extend(conjuncts(c))
        return out
    if isinstance(node, Always):
        return []
    return [node]


# ------------------------------------------------------------------------------------------- evaluator


def compile_predicate(node):
    """A function ``doc -> bool`` evaluating ``node`` over a document (a dict, e.g. bson.decode's)."""
    if isinstance(node, Mapping):
        node = from_mongo(node)
    return _compile(node)


def matches(node, doc):
    """Whether ``doc`` matches ``node`` (a Node or a MongoDB matcher dict)."""
    return compile_predicate(node)(doc)


def _getter(path):
    parts = split_path(path)
    if len(parts) == 1:
        k = parts[0]

        def get1(doc):
            return doc.get(k, MISSING) if isinstance(doc, dict) else MISSING
        return get1
    return lambda doc: get_path(doc, parts)


def _compile(node):
    t = type(node)
    if t is Always:
        return lambda doc: True
    if t is And:
        fns = [_compile(c) for c in node.children]
        return lambda doc: all(f(doc) for f in fns)
    if t is Or:
        fns = [_compile(c) for c in node.children]
        return lambda doc: any(f(doc) for f in fns)
    if t is Not:
        f = _compile(node.child)
        return lambda doc: not f(doc)
    get = _getter(node.path)
    if t is Eq or t is Ne:
        lit = node.value
        k = kind_of(lit)
        if k == K_STR or k == K_BOOL:
            lt = type(lit)

            def eq(doc):
                v = get(doc)
                return type(v) is lt and v == lit or (type(v) is not lt and v is not MISSING
                                                      and values_equal(v, lit))
        else:
            def eq(doc):
                v = get(doc)
                return v is not MISSING and values_equal(v, lit)
        if t is Eq:
            return eq
        return lambda doc: not eq(doc)
    if t is Lt or t is Le or t is Gt or t is Ge:
        lit = node.value
        op = {Lt: _LT, Le: _LE, Gt: _GT, Ge: _GE}[t]

        def cmp(doc):
            v = get(doc)
            return v is not MISSING and compare(v, lit, op)
        return cmp
    if t is In or t is Nin:
        lits = node.values

        def isin(doc):
            v = get(doc)
            return v is not MISSING and any(values_equal(v, x) for x in lits)
        if t is In:
            return isin
        return lambda doc: not isin(doc)
    if t is Exists:
        want = node.present
        return lambda doc: (get(doc) is not MISSING) == want
    if t is Regex:
        search = node.compiled.search

        def rx(doc):
            v = get(doc)
            return kind_of(v) == K_STR and search(v) is not None
        return rx
    if t is Contains:
        sub = node.substring

        def contains(doc):
            v = get(doc)
            return kind_of(v) == K_STR and sub in v
        return contains
    raise InvalidArgument(f"not a predicate node: {node!r}")


# ----------------------------------------------------------------------------------- MongoDB matchers


_CMP_OPS = {"$eq": Eq, "$ne": Ne, "$gt": Gt, "$gte": Ge, "$lt": Lt, "$lte": Le}


def from_mongo(query):
    """Compile a MongoDB-syntax matcher to a node.

    Supported: implicit equality ``{"a": v}`` (also of whole embedded documents), ``$eq $ne $gt $gte $lt
    $lte $in $nin $exists $regex`` (with ``$options``) and ``$not`` on fields, a compiled ``re`` pattern
    or ``bson.Regex`` as a field value (a regex match), ``$and $or $nor`` (non-empty lists of matchers),
    dotted paths. Several operators on one field, and several fields, are ANDed. ``{}`` is TRUE.
    Raises InvalidArgument (a ValueError) for anything else, naming the offending part.
    """
    if not isinstance(query, Mapping):
        raise InvalidArgument(f"a matcher must be a document (dict), not {type(query).__name__}")
    parts = []
    for key, value in query.items():
        if not isinstance(key, str):
            raise InvalidArgument(f"matcher keys must be str, not {key!r}")
        if key.startswith("$"):
            if key not in ("$and", "$or", "$nor"):
                raise InvalidArgument(f"unknown top-level operator {key!r} (supported: $and, $or, $nor)")
            if not isinstance(value, (list, tuple)) or not value:
                raise InvalidArgument(f"{key} needs a non-empty list of matchers")
            subs = tuple(from_mongo(q) for q in value)
            if key == "$and":
                parts.append(And(subs))
            elif key == "$or":
                parts.append(Or(subs))
            else:
                parts.append(Not(Or(subs)))
        else:
            try:
                split_path(key)
            except InvalidArgument as e:
                raise InvalidArgument(f"bad field path in matcher: {e}") from None
            parts.extend(_field_ops(key, value))
    if not parts:
        return TRUE
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def _flag_letters(f):
    return "".join(c for c, v in _REGEX_FLAGS.items() if f & v)


def _regex_node(path, pattern, options=""):
    if isinstance(pattern, BsonRegex):
        flags = pattern.flags
        options = options or (flags if isinstance(flags, str) else _flag_letters(flags))
        pattern = pattern.pattern
        if isinstance(pattern, bytes):
            pattern = pattern.decode("utf-8")
    elif isinstance(pattern, re.Pattern):
        options = options or _flag_letters(pattern.flags)
        pattern = pattern.pattern
    if not isinstance(pattern, str):
        raise InvalidArgument(f"$regex on {path!r} needs a string pattern, not {type(pattern).__name__}")
    if not isinstance(options, str):
        raise InvalidArgument(f"$options on {path!r} must be a string")
    return Regex(path, pattern, "".join(c for c in options if c != "u"))


def _field_ops(path, value):
    if isinstance(value, (re.Pattern, BsonRegex)):
        return [_regex_node(path, value)]
    if not isinstance(value, Mapping) or not value:
        return [Eq(path, value)]
    keys = list(value)
    dollar = [isinstance(k, str) and k.startswith("$") for k in keys]
    if not any(dollar):
        return [Eq(path, value)]            # implicit equality with an embedded document
    if not all(dollar):
        raise InvalidArgument(f"field {path!r} mixes operators and plain keys: {keys!r}")
    ops = []
    for op, arg in value.items():
        if op in _CMP_OPS:
            ops.append(_CMP_OPS[op](path, arg))
        elif op in ("$in", "$nin"):
            if not isinstance(arg, (list, tuple)):
                raise InvalidArgument(f"{op} on {path!r} needs a list, not {type(arg).__name__}")
            ops.append((In if op == "$in" else Nin)(path, tuple(arg)))
        elif op == "$exists":
            ops.append(Exists(path, bool(arg)))
        elif op == "$regex":
            ops.append(_regex_node(path, arg, value.get("$options", "")))
        elif op == "$options":
            if "$regex" not in value:
                raise InvalidArgument(f"$options on {path!r} without $regex")
        elif op == "$not":
            if isinstance(arg, (re.Pattern, BsonRegex)):
                ops.append(Not(_regex_node(path, arg)))
            elif isinstance(arg, Mapping) and arg and all(isinstance(k, str) and k.startswith("$") for k in arg):
                inner = _field_ops(path, arg)
                ops.append(Not(inner[0] if len(inner) == 1 else And(tuple(inner))))
            else:
                raise InvalidArgument(f"$not on {path!r} needs an operator document or a regex")
        else:
            raise InvalidArgument(f"unknown operator {op!r} on field {path!r}")
    return ops


# ------------------------------------------------------------------------------ raw BSON matcher program

# program opcodes and comparison codes: the format is specified in riverbed.engine._pydocs
OP_TRUE, OP_FALSE, OP_AND, OP_OR, OP_NOT, OP_CMP, OP_EXISTS, OP_CONTAINS, OP_REGEX, OP_UNSURE = range(10)
CMP_EQ, CMP_LT, CMP_LE, CMP_GT, CMP_GE = range(5)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _bpath(path):
    return tuple(p.encode("utf-8", "surrogatepass") for p in split_path(path))


def _cmp_program(path, cmp, lit):
    k = kind_of(lit)
    bp = _bpath(path)
    if k == K_NULL or k == K_BOOL:
        return (OP_CMP, bp, cmp, bool(lit) if k == K_BOOL else None)
    if k == K_STR:
        try:
            return (OP_CMP, bp, cmp, str(lit).encode("utf-8"))
        except UnicodeEncodeError:
            # stored strings are valid UTF-8, so they never equal this one; ordering needs Python
            return (OP_FALSE,) if cmp == CMP_EQ else (OP_UNSURE, bp, K_STR)
    if k == K_NUM:
        if isinstance(lit, float):
            return (OP_FALSE,) if math.isnan(lit) else (OP_CMP, bp, cmp, float(lit))
        if _INT64[0] <= lit <= _INT64[1]:
            return (OP_CMP, bp, cmp, int(lit))
        return (OP_UNSURE, bp, K_NUM)
    return (OP_UNSURE, bp, K_OTHER)


def raw_program(node):
    """The raw-BSON matcher program of ``node`` (a Node or a MongoDB matcher dict); see _pydocs."""
    if isinstance(node, Mapping):
        node = from_mongo(node)
    t = type(node)
    if t is Always:
        return (OP_TRUE,)
    if t is And or t is Or:
        return (OP_AND if t is And else OP_OR, tuple(raw_program(c) for c in node.children))
    if t is Not:
        return (OP_NOT, raw_program(node.child))
    if t is Eq:
        return _cmp_program(node.path, CMP_EQ, node.value)
    if t is Ne:
        return (OP_NOT, _cmp_program(node.path, CMP_EQ, node.value))
    if t in (Lt, Le, Gt, Ge):
        return _cmp_program(node.path, {Lt: CMP_LT, Le: CMP_LE, Gt: CMP_GT, Ge: CMP_GE}[t], node.value)
    if t is In or t is Nin:
        p = (OP_OR, tuple(_cmp_program(node.path, CMP_EQ, v) for v in node.values))
        return p if t is In else (OP_NOT, p)
    if t is Exists:
        p = (OP_EXISTS, _bpath(node.path))
        return p if node.present else (OP_NOT, p)
    if t is Contains:
        try:
            return (OP_CONTAINS, _bpath(node.path), node.substring.encode("utf-8"))
        except UnicodeEncodeError:
            return (OP_FALSE,)
    if t is Regex:
        return (OP_REGEX, _bpath(node.path), node.compiled)
    raise InvalidArgument(f"not a predicate node: {node!r}")

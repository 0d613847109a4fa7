"""The REAM expression language: a tokenizer, a Pratt (precedence-climbing) parser, a compiler to the
document store's predicate tree (:mod:`riverbed.engine.predicate`, so SELECT/UPDATE/DELETE use the
indexes of ``+`` and ``*`` fields) and a small evaluator for UPDATE's value expressions.

Grammar (FACTS.md § 002, parser.gleam; binding from loosest)::

    OR  <  AND = prefix NOT  <  = !=  <  < <= > >= =~ IN CONTAINS  <  + -  <  prefix -

    literals   123  -4  1.5  2e3  "text"  NULL TRUE FALSE      (keywords are UPPERCASE)
    fields     [A-Za-z][A-Za-z0-9_]*  (a bare identifier is a field of the row)
    grouping   ( expr )        lists  ( a, b, ... )  (for IN)

So ``a OR b AND c`` is ``a OR (b AND c)`` and ``NOT x = 1 AND y > 2`` is ``(NOT (x = 1)) AND (y > 2)``.
Binary operators associate to the left. ``=~`` is an unanchored regex search (Python ``re``),
``CONTAINS`` a substring test. A comparison needs a field on one side and a constant on the other
(constants fold: ``salary > 1000 + 500``). A bare field as a condition means ``field = TRUE``.

The UPDATE value payload is a JSON object whose values are expressions over the old row::

    {"position": "manager", "salary": salary + 1000, "tags": ["a", "b"], "ok": true}

(JSON's lower-case ``true false null`` are literals there, nested ``{}``/``[]`` are allowed.)

Values follow the store's rules (:mod:`riverbed.engine.predicate`): a missing field equals nothing
(``!=`` is true on it), comparisons across kinds are false, booleans are not numbers. ``+`` adds numbers
or concatenates strings, ``-`` subtracts numbers; anything else is an error that refuses the UPDATE.

Every error is an :class:`ExprError` whose message carries the 1-based character position. Pure and
thread-safe.
"""

import math
import re

from riverbed.engine import predicate as P
from riverbed.engine.errors import InvalidArgument

MAX_DEPTH = 200          # nesting limit: deeper input is an error, never a RecursionError

# token kinds
T_NUM, T_STR, T_IDENT, T_KW, T_OP, T_END = "number", "string", "identifier", "keyword", "operator", "end"

KEYWORDS = {"AND", "OR", "NOT", "IN", "CONTAINS", "NULL", "TRUE", "FALSE"}
JSON_LITERALS = {"true": True, "false": False, "null": None}
CONSTANTS = {"NULL": None, "TRUE": True, "FALSE": False}

# binding powers (left binding power of infix operators)
BP_OR, BP_AND, BP_NOT, BP_EQ, BP_CMP, BP_ADD, BP_NEG = 4, 5, 5, 9, 10, 11, 12
INFIX_BP = {"OR": BP_OR, "AND": BP_AND, "=": BP_EQ, "!=": BP_EQ, "<": BP_CMP, "<=": BP_CMP, ">": BP_CMP,
            ">=": BP_CMP, "=~": BP_CMP, "IN": BP_CMP, "CONTAINS": BP_CMP, "+": BP_ADD, "-": BP_ADD}
COMPARISONS = {"=", "!=", "<", "<=", ">", ">=", "=~", "IN", "CONTAINS"}
FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}

_NUM_RE = re.compile(r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE_RE = re.compile(r"\s+")
_OPS2 = ("!=", "<=", ">=", "=~")
_OPS1 = "=<>+-(),{}[]:"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class ExprError(ValueError):
    """A syntax or type error in an expression; ``pos`` is the 1-based character position."""

    def __init__(self, message, pos):
        super().__init__(f"{message} at position {pos}")
        self.pos = pos


# --------------------------------------------------------------------------------------- tokenizer


class Token:
    __slots__ = ("kind", "value", "pos")

    def __init__(self, kind, value, pos):
        self.kind, self.value, self.pos = kind, value, pos

    def is_op(self, op):
        return (self.kind == T_OP or self.kind == T_KW) and self.value == op

    def __repr__(self):
        return f"Token({self.kind}, {self.value!r}, {self.pos})"


def tokenize(text):
    """The tokens of ``text`` (positions 1-based), ending with a T_END token. ExprError on bad input."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        m = _SPACE_RE.match(text, i)
        if m:
            i = m.end()
            continue
        pos = i + 1
        if c == '"':
            s, i = _read_string(text, i)
            out.append(Token(T_STR, s, pos))
        elif "0" <= c <= "9":          # not isdigit(): "²" or "٣" are digits to it, not to _NUM_RE
            m = _NUM_RE.match(text, i)
            word = m.group(0)
            i = m.end()
            if i < n and (text[i].isalnum() or text[i] == "_"):
                raise ExprError(f"bad number {word + text[i]!r}", pos)
            out.append(Token(T_NUM, float(word) if (m.group(1) or m.group(2)) else int(word), pos))
        elif (c.isascii() and c.isalpha()) or c == "_":   # "ߑ" is alpha too, but no identifier starts with it
            m = _IDENT_RE.match(text, i)
            word = m.group(0)
            i = m.end()
            if word in KEYWORDS:
                out.append(Token(T_KW, word, pos))
            elif c == "_":
                raise ExprError(f"bad identifier {word!r} (a field name starts with a letter)", pos)
            else:
                out.append(Token(T_IDENT, word, pos))
        elif text.startswith(_OPS2, i):
            out.append(Token(T_OP, text[i:i + 2], pos))
            i += 2
        elif c in _OPS1:
            out.append(Token(T_OP, c, pos))
            i += 1
        else:
            raise ExprError(f"unexpected character {c!r}", pos)
    out.append(Token(T_END, None, n + 1))
    return out


def _read_string(text, i):
    """The string literal starting at ``text[i] == '"'``: (value, index after it). JSON escapes."""
    start = i
    i += 1
    parts = []
    n = len(text)
    while True:
        j = i
        while j < n and text[j] not in '"\\':
            j += 1
        parts.append(text[i:j])
        if j >= n:
            raise ExprError("unterminated string", start + 1)
        if text[j] == '"':
            return "".join(parts), j + 1
        # a backslash escape
        if j + 1 >= n:
            raise ExprError("unterminated string", start + 1)
        e = text[j + 1]
        if e in _ESCAPES:
            parts.append(_ESCAPES[e])
            i = j + 2
        elif e == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", text[j + 2:j + 6] or ""):
            parts.append(chr(int(text[j + 2:j + 6], 16)))
            i = j + 6
        else:
            raise ExprError(f"bad escape \\{e} in string", j + 1)


# ------------------------------------------------------------------------------------------ parser
# AST: tuples (kind, ..., pos):
#   ("lit", value, pos)  ("field", name, pos)  ("list", [items], pos)  ("not", x, pos)  ("neg", x, pos)
#   ("bin", op, left, right, pos)  ("obj", [(key, expr)], pos)  ("arr", [items], pos)


class Parser:
    """A Pratt parser over the tokens of one expression. ``json_mode`` admits JSON objects, arrays and the
    lower-case literals (the UPDATE value payload)."""

    def __init__(self, text, json_mode=False):
        self.tokens = tokenize(text)
        self.i = 0
        self.json_mode = json_mode
        self.depth = 0

    @property
    def tok(self):
        return self.tokens[self.i]

    def advance(self):
        t = self.tokens[self.i]
        self.i += 1
        return t

    def expect(self, op, what):
        t = self.tok
        if not t.is_op(op):
            raise ExprError(f"expected {what}, found {_describe(t)}", t.pos)
        return self.advance()

    def parse_all(self):
        if self.tok.kind == T_END:
            raise ExprError("empty expression", self.tok.pos)
        node = self.parse_expr(0)
        if self.tok.kind != T_END:
            raise ExprError(f"unexpected {_describe(self.tok)}", self.tok.pos)
        return node

    def parse_expr(self, rbp):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExprError("expression nested too deeply", self.tok.pos)
        try:
            left = self.nud(self.advance())
            while True:
                t = self.tok
                if t.kind not in (T_OP, T_KW):
                    break
                bp = INFIX_BP.get(t.value)
                if bp is None or bp <= rbp:
                    break
                self.advance()
                if self.tok.kind == T_END:
                    raise ExprError(f"dangling operator {t.value}", t.pos)
                right = self.parse_expr(bp)
                left = ("bin", t.value, left, right, t.pos)
            return left
        finally:
            self.depth -= 1

    def nud(self, t):
        k, v = t.kind, t.value
        if k == T_NUM or k == T_STR:
            return ("lit", v, t.pos)
        if k == T_IDENT:
            if self.json_mode and v in JSON_LITERALS:
                return ("lit", JSON_LITERALS[v], t.pos)
            return ("field", v, t.pos)
        if k == T_KW:
            if v in CONSTANTS:
                return ("lit", CONSTANTS[v], t.pos)
            if v == "NOT":
                if self.tok.kind == T_END:
                    raise ExprError("dangling operator NOT", t.pos)
                return ("not", self.parse_expr(BP_NOT), t.pos)
            raise ExprError(f"operator {v} needs a left operand", t.pos)
        if k == T_END:
            raise ExprError("unexpected end of expression", t.pos)
        # operators
        if v == "(":
            return self._group(t)
        if v == "-":
            if self.tok.kind == T_END:
                raise ExprError("dangling operator -", t.pos)
            return ("neg", self.parse_expr(BP_NEG), t.pos)
        if self.json_mode and v == "{":
            return self._object(t)
        if self.json_mode and v == "[":
            return self._array(t)
        raise ExprError(f"unexpected {_describe(t)}", t.pos)

    def _group(self, t):
        if self.tok.is_op(")"):
            self.advance()
            return ("list", [], t.pos)
        first = self.parse_expr(0)
        if self.tok.is_op(")"):
            self.advance()
            return first
        if not self.tok.is_op(","):
            if self.tok.kind == T_END:
                raise ExprError("unterminated list or group: missing )", t.pos)
            raise ExprError(f"expected , or ) but found {_describe(self.tok)}", self.tok.pos)
        items = [first]
        while self.tok.is_op(","):
            self.advance()
            if self.tok.kind == T_END:
                raise ExprError("unterminated list: missing )", t.pos)
            items.append(self.parse_expr(0))
        if not self.tok.is_op(")"):
            if self.tok.kind == T_END:
                raise ExprError("unterminated list: missing )", t.pos)
            raise ExprError(f"expected , or ) but found {_describe(self.tok)}", self.tok.pos)
        self.advance()
        return ("list", items, t.pos)

    def _object(self, t):
        pairs = []
        seen = set()
        if self.tok.is_op("}"):
            self.advance()
            return ("obj", pairs, t.pos)
        while True:
            kt = self.advance()
            if kt.kind == T_STR or kt.kind == T_IDENT:
                key = kt.value
            elif kt.kind == T_END:
                raise ExprError("unterminated object: missing }", t.pos)
            else:
                raise ExprError(f"expected a key, found {_describe(kt)}", kt.pos)
            if key in seen:
                raise ExprError(f"key {key!r} given twice", kt.pos)
            seen.add(key)
            self.expect(":", "':' after the key")
            pairs.append((key, self.parse_expr(0)))
            if self.tok.is_op(","):
                self.advance()
                continue
            if self.tok.is_op("}"):
                self.advance()
                return ("obj", pairs, t.pos)
            if self.tok.kind == T_END:
                raise ExprError("unterminated object: missing }", t.pos)
            raise ExprError(f"expected , or }} but found {_describe(self.tok)}", self.tok.pos)

    def _array(self, t):
        items = []
        if self.tok.is_op("]"):
            self.advance()
            return ("arr", items, t.pos)
        while True:
            if self.tok.kind == T_END:
                raise ExprError("unterminated array: missing ]", t.pos)
            items.append(self.parse_expr(0))
            if self.tok.is_op(","):
                self.advance()
                continue
            if self.tok.is_op("]"):
                self.advance()
                return ("arr", items, t.pos)
            if self.tok.kind == T_END:
                raise ExprError("unterminated array: missing ]", t.pos)
            raise ExprError(f"expected , or ] but found {_describe(self.tok)}", self.tok.pos)


def _describe(t):
    if t.kind == T_END:
        return "end of expression"
    if t.kind == T_STR:
        return f"string {t.value!r}"
    return f"{t.kind} {t.value!r}" if t.kind != T_OP else f"{t.value!r}"


def parse(text):
    """The AST of a condition expression (SELECT/UPDATE/DELETE). ExprError on a syntax error."""
    return Parser(text).parse_all()


# ----------------------------------------------------------------------------------- evaluation

_MISSING = P.MISSING
_CMP_CODES = {"<": 1, "<=": 2, ">": 3, ">=": 4}


def _is_num(v):
    return (type(v) is int or type(v) is float)


def evaluate(node, row):
    """The value of ``node`` over ``row`` (a dict); a missing field is :data:`predicate.MISSING`.
    Conditions evaluate to True/False with the store's semantics. ExprError on a type error."""
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "field":
        return row.get(node[1], _MISSING) if isinstance(row, dict) else _MISSING
    if kind == "bin":
        op = node[1]
        if op == "AND":
            return _truth(evaluate(node[2], row)) and _truth(evaluate(node[3], row))
        if op == "OR":
            return _truth(evaluate(node[2], row)) or _truth(evaluate(node[3], row))
        a = evaluate(node[2], row)
        b = evaluate(node[3], row)
        if op == "+" or op == "-":
            return _arith(op, a, b, node[4])
        return _compare(op, a, b, node[4])
    if kind == "not":
        return not _truth(evaluate(node[1], row))
    if kind == "neg":
        v = evaluate(node[1], row)
        if not _is_num(v):
            raise ExprError(f"cannot negate {_kind_name(v)}", node[2])
        return -v
    if kind == "list" or kind == "arr":
        return [_present(evaluate(x, row), x) for x in node[1]]
    if kind == "obj":
        return {k: _present(evaluate(v, row), v) for k, v in node[1]}
    raise ExprError(f"unknown node {kind}", node[-1])


def _present(v, node):
    if v is _MISSING:
        raise ExprError(f"field {node[1]!r} is missing", node[-1])
    return v


def _truth(v):
    return v is True


def _kind_name(v):
    if v is _MISSING:
        return "a missing field"
    if v is None:
        return "NULL"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)


def _arith(op, a, b, pos):
    if _is_num(a) and _is_num(b):
        r = a + b if op == "+" else a - b
        if type(r) is float and not math.isfinite(r):
            raise ExprError("arithmetic overflow", pos)
        return r
    if op == "+" and type(a) is str and type(b) is str:
        return a + b
    raise ExprError(f"cannot apply {op} to {_kind_name(a)} and {_kind_name(b)}", pos)


def _compare(op, a, b, pos):
    if op == "IN":
        if not isinstance(b, list):
            b = [b]
        return a is not _MISSING and any(P.values_equal(a, x) for x in b)
    if b is _MISSING:
        # comparing with a missing field: the same rules from the other side
        if op in FLIPPED:
            return _compare(FLIPPED[op], b, a, pos)
        return False
    if op == "=":
        return a is not _MISSING and P.values_equal(a, b)
    if op == "!=":
        return a is _MISSING or not P.values_equal(a, b)
    if a is _MISSING:
        return False
    if op == "=~":
        if type(b) is not str:
            raise ExprError("=~ needs a string pattern", pos)
        try:
            rx = P.compile_regex(b)
        except InvalidArgument as e:
            raise ExprError(str(e), pos) from None
        return type(a) is str and rx.search(a) is not None
    if op == "CONTAINS":
        if type(b) is not str:
            raise ExprError("CONTAINS needs a string", pos)
        return type(a) is str and b in a
    return P.compare(a, b, _CMP_CODES[op])


# --------------------------------------------------------------------------- compile to predicates

_NOT_CONST = object()


def _const(node):
    """The value of a node without fields (constants fold), or _NOT_CONST."""
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "field":
        return _NOT_CONST
    if kind == "neg":
        v = _const(node[1])
        return _NOT_CONST if v is _NOT_CONST else evaluate(node, {})
    if kind == "list":
        vals = [_const(x) for x in node[1]]
        return _NOT_CONST if any(v is _NOT_CONST for v in vals) else vals
    if kind == "bin" and node[1] in ("+", "-"):
        a, b = _const(node[2]), _const(node[3])
        if a is _NOT_CONST or b is _NOT_CONST:
            return _NOT_CONST
        return _arith(node[1], a, b, node[4])
    return _NOT_CONST


def to_predicate(node):
    """Compile a condition AST to a predicate tree node. ExprError for what has no predicate form (a
    comparison of two fields, arithmetic on a field, a constant that is not a boolean)."""
    kind = node[0]
    if kind == "bin":
        op = node[1]
        if op == "AND" or op == "OR":
            children = []
            cls = P.And if op == "AND" else P.Or
            for side in (node[2], node[3]):
                c = to_predicate(side)
                # flatten a chain of the same operator: one And/Or node, which the planner reads whole
                children.extend(c.children if type(c) is cls else (c,))
            return cls(children)
        if op in COMPARISONS:
            return _comparison(node)
        raise ExprError(f"{op} gives a value, not a condition", node[4])
    if kind == "not":
        return P.Not(to_predicate(node[1]))
    if kind == "field":
        return P.Eq(node[1], True)
    if kind == "lit" and node[1] is True:
        return P.TRUE
    if kind == "lit" and node[1] is False:
        return P.Or(())
    raise ExprError("not a condition", node[-1])


def _comparison(node):
    op, left, right, pos = node[1], node[2], node[3], node[4]
    if left[0] != "field" and right[0] == "field" and op in FLIPPED:
        left, right, op = right, left, FLIPPED[op]
    if left[0] != "field":
        raise ExprError(f"{op} needs a field on its left", left[-1])
    value = _const(right)
    if value is _NOT_CONST:
        raise ExprError(f"{op} compares a field with a constant (not with another field or expression)",
                        right[-1])
    path = left[1]
    try:
        if op == "=":
            return P.Eq(path, value)
        if op == "!=":
            return P.Ne(path, value)
        if op == "<":
            return P.Lt(path, value)
        if op == "<=":
            return P.Le(path, value)
        if op == ">":
            return P.Gt(path, value)
        if op == ">=":
            return P.Ge(path, value)
        if op == "IN":
            return P.In(path, tuple(value) if isinstance(value, list) else (value,))
        if op == "=~":
            if type(value) is not str:
                raise ExprError("=~ needs a string pattern", right[-1])
            return P.Regex(path, value)
        if type(value) is not str:
            raise ExprError("CONTAINS needs a string", right[-1])
        return P.Contains(path, value)
    except InvalidArgument as e:
        raise ExprError(str(e), pos) from None


def compile_where(text):
    """A condition expression (str) -> predicate tree node. ExprError with the position on any error."""
    return to_predicate(parse(text))


class UpdateSpec:
    """A compiled UPDATE value payload: ``apply(old_row)`` returns the new row (the old keys not listed
    keep their values). Pure, so the store may run it more than once."""

    __slots__ = ("pairs",)

    def __init__(self, pairs):
        self.pairs = pairs

    @property
    def keys(self):
        return [k for k, _ in self.pairs]

    def apply(self, row):
        new = dict(row)
        for key, node in self.pairs:
            new[key] = _present(evaluate(node, row), node)
        return new


def compile_update(text):
    """The UPDATE value payload (a JSON object whose values are expressions) -> :class:`UpdateSpec`."""
    p = Parser(text, json_mode=True)
    node = p.parse_all()
    if node[0] != "obj":
        raise ExprError("the update must be an object {\"field\": expression, ...}", node[-1])
    return UpdateSpec(node[1])


"""The predicate tree (riverbed.engine.predicate), its MongoDB compiler, the index value keys
(riverbed.engine.dockeys) and the raw-BSON matcher twins (compiled ``docs.pxi``, pure ``_pydocs``).

The differential tests feed random documents and predicates to the Python evaluator and to both raw
matchers, and random values to the key encoder, and demand agreement (and order preservation)."""

import math
import re

import bson
import pytest
from bson.code import Code
from bson.int64 import Int64
from bson.regex import Regex as BsonRegex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.engine import _pydocs, core
from riverbed.engine.dockeys import (
    STRING_CUT, decode_value_key, id_from_key, id_key, is_truncated, value_key, value_key_len,
)
from riverbed.engine.errors import InvalidArgument
from riverbed.engine.predicate import (
    MISSING, TRUE, Always, And, Contains, Eq, Exists, Ge, Gt, In, Le, Lt, Ne, Nin, Not, Or, Regex,
    compile_predicate, from_mongo, get_path, matches, raw_program, split_path,
)

PROPERTY = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# ------------------------------------------------------------------------------------------ semantics

DOC = {"a": 5, "f": 1.5, "s": "hello", "b": True, "n": None, "d": {"x": 1, "y": "z"}, "l": [10, "w", None],
       "big": 2 ** 60}


@pytest.mark.parametrize("node, expected", [
    (Eq("a", 5), True), (Eq("a", 5.0), True), (Eq("a", "5"), False), (Eq("a", True), False),
    (Eq("b", 1), False), (Eq("b", True), True), (Eq("n", None), True), (Eq("zz", None), False),
    (Eq("d", {"x": 1, "y": "z"}), True), (Eq("d", {"y": "z", "x": 1}), False), (Eq("d", {"x": True, "y": "z"}), False),
    (Eq("d.x", 1), True), (Eq("d.x.q", 1), False), (Eq("l", [10, "w", None]), True), (Eq("l.0", 10), True),
    (Eq("l.1", "w"), True), (Eq("l.01", 10), False), (Eq("l.3", 10), False), (Eq("l", 10), False),
    (Ne("a", 5), False), (Ne("a", 6), True), (Ne("zz", 1), True), (Ne("n", None), False),
    (Lt("a", 6), True), (Lt("a", 5), False), (Le("a", 5), True), (Gt("a", 4.5), True), (Ge("f", 1.5), True),
    (Lt("a", "6"), False), (Gt("s", "hell"), True), (Lt("s", "help"), True), (Gt("s", 1), False),
    (Lt("b", True), False), (Gt("b", False), True), (Le("n", None), True), (Lt("n", None), False),
    (Gt("zz", 0), False), (Lt("zz", 0), False), (Lt("d", {"x": 2}), False), (Gt("big", 2 ** 60 - 1), True),
    (Gt("a", float("nan")), False), (Eq("f", float("nan")), False),
    (In("a", [1, 5]), True), (In("a", []), False), (In("zz", [None]), False), (Nin("a", [1, 5]), False),
    (Nin("zz", [1]), True), (Nin("a", []), True),
    (Exists("n"), True), (Exists("zz"), False), (Exists("zz", False), True), (Exists("d.x"), True),
    (Regex("s", "ell"), True), (Regex("s", "^ell"), False), (Regex("s", "HEL", "i"), True), (Regex("a", "5"), False),
    (Contains("s", "ll"), True), (Contains("s", "x"), False), (Contains("a", "5"), False), (Contains("s", ""), True),
    (And([Eq("a", 5), Eq("s", "hello")]), True), (And([Eq("a", 5), Eq("s", "x")]), False), (And([]), True),
    (Or([Eq("a", 1), Eq("s", "hello")]), True), (Or([]), False), (Not(Eq("a", 5)), False), (TRUE, True),
])
def test_evaluator_semantics(node, expected):
    assert matches(node, DOC) is expected
    prog = raw_program(node)
    raw = bson.encode(DOC)
    for impl in _twins():
        r = impl.DocMatcher(prog).match(raw)
        assert r == -1 or bool(r) is expected, (impl, node, r)


def _twins():
    out = [_pydocs]
    if not core.NO_EXTENSIONS:
        from riverbed.engine import _core
        out.append(_core)
    return out


def test_missing_fields_never_equal_anything_but_ne_and_nin_match_them():
    doc = {"x": 1}
    for node in (Eq("m", None), Eq("m", 0), Lt("m", 1), Le("m", None), Ge("m", None), In("m", [None, 1]),
                 Regex("m", ""), Contains("m", "")):
        assert not matches(node, doc), node
    for node in (Ne("m", None), Ne("m", 1), Nin("m", [None]), Exists("m", False), Not(Exists("m"))):
        assert matches(node, doc), node


def test_get_path_steps_into_dicts_and_lists():
    assert get_path({"a": {"b": [1, {"c": 2}]}}, ("a", "b", "1", "c")) == 2
    assert get_path({"a": [1]}, ("a", "-1")) is MISSING
    assert get_path({"a": "str"}, ("a", "0")) is MISSING
    assert split_path("a.b") == ("a", "b")
    for bad in ("", "a..b", ".a", 5, None):
        with pytest.raises(InvalidArgument):
            split_path(bad)


def test_nodes_are_values():
    assert Eq("a", 1) == Eq("a", 1) and Eq("a", 1) != Ne("a", 1)
    assert In("a", [1, 2]) == In("a", (1, 2)) and In("a", [1]) != Nin("a", [1])
    assert And([Eq("a", 1)]).children == (Eq("a", 1),)
    assert (Eq("a", 1) & Eq("b", 2)) == And((Eq("a", 1), Eq("b", 2)))
    assert (~Eq("a", 1)) == Not(Eq("a", 1))
    assert isinstance(TRUE, Always)
    with pytest.raises(InvalidArgument):
        Eq("", 1)
    with pytest.raises(InvalidArgument):
        In("a", 5)
    with pytest.raises(InvalidArgument):
        And([1])
    with pytest.raises(InvalidArgument):
        Regex("a", "(")
    with pytest.raises(InvalidArgument):
        Regex("a", "x", "q")


# ------------------------------------------------------------------------------------------ from_mongo


def test_from_mongo_compiles_the_supported_syntax():
    q = from_mongo({"a": 1, "b.c": {"$gt": 1, "$lte": 5}, "d": {"$in": [1, 2]}, "e": {"$nin": [3]},
                    "f": {"$exists": False}, "g": {"$regex": "^x", "$options": "i"}, "h": {"$ne": None},
                    "$or": [{"i": 1}, {"j": {"$eq": 2}}], "$and": [{"k": {"$lt": 0}}],
                    "$nor": [{"l": 1}], "m": {"$not": {"$gt": 3}}, "o": {"p": 1}, "q": re.compile("z", re.I)})
    assert q == And((
        Eq("a", 1), Gt("b.c", 1), Le("b.c", 5), In("d", (1, 2)), Nin("e", (3,)), Exists("f", False),
        Regex("g", "^x", "i"), Ne("h", None), Or((Eq("i", 1), Eq("j", 2))), And((Lt("k", 0),)),
        Not(Or((Eq("l", 1),))), Not(Gt("m", 3)), Eq("o", {"p": 1}), Regex("q", "z", "i")))
    assert from_mongo({}) == TRUE
    assert from_mongo({"a": {}}) == Eq("a", {})
    assert from_mongo({"r": BsonRegex("^a", "i")}) == Regex("r", "^a", "i")
    assert matches({"a": {"$gt": 1, "$lt": 3}}, {"a": 2}) and not matches({"a": {"$gt": 1, "$lt": 3}}, {"a": 3})


@pytest.mark.parametrize("query", [
    [], "a", {"$where": "1"}, {"a": {"$gt": 1, "b": 2}}, {"a": {"$foo": 1}}, {"a": {"$in": 5}},
    {"$or": []}, {"$or": {"a": 1}}, {"$and": [5]}, {"a": {"$options": "i"}}, {"a": {"$regex": 5}},
    {"a": {"$regex": "("}}, {"a": {"$regex": "x", "$options": "q"}}, {"": 1}, {"a..b": 1}, {5: 1},
    {"a": {"$not": 5}},
])
def test_from_mongo_refuses_bad_syntax_with_invalid_argument(query):
    with pytest.raises(InvalidArgument) as e:
        from_mongo(query)
    assert isinstance(e.value, ValueError) and str(e.value)


# ------------------------------------------------------------------------------------------ value keys


def test_number_keys_order_ints_and_floats_as_numbers():
    values = [float("-inf"), -2 ** 63, -2 ** 53 - 1, float(-2 ** 53), -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2,
              2 ** 53, 2 ** 53 + 1, 2.0 ** 54, 2 ** 54 + 1, 2 ** 63 - 1, 2.0 ** 63, 2 ** 70, 1e300, float("inf")]
    keys = [value_key(v) for v in values]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert value_key(-0.0) == value_key(0.0) == value_key(0)
    assert value_key(1) == value_key(1.0) == value_key(Int64(1))
    assert value_key(2 ** 53 + 1) != value_key(float(2 ** 53 + 1))
    assert value_key(float("nan")) is None and value_key(10 ** 400) is None
    assert value_key(None) < value_key(-1e308) < value_key(float("inf")) < value_key("") < value_key(False) \
        < value_key(True)
    for v in ([1], {"a": 1}, b"x", Code("x")):
        assert value_key(v) is None


def test_string_keys_are_self_delimiting_and_long_strings_share_a_truncated_key():
    s = ["", "\x00", "\x00\x00", "\x00a", "a", "a\x00", "ab", "b", "é", "\U0001f600"]
    keys = [value_key(x) for x in s]
    assert keys == sorted(keys)
    long1, long2 = "x" * STRING_CUT + "a", "x" * STRING_CUT + "b"
    assert value_key(long1) == value_key(long2) and is_truncated(value_key(long1))
    assert value_key("x" * STRING_CUT) < value_key(long1) and not is_truncated(value_key("x" * STRING_CUT))
    for k in keys + [value_key(long1), value_key(1.5), value_key(None), value_key(True), value_key(2 ** 60 + 1)]:
        assert value_key_len(k + id_key(7), 0) == len(k)
    assert decode_value_key(value_key("a\x00b")) == "a\x00b"
    assert decode_value_key(value_key(2 ** 60 + 1)) == 2 ** 60 + 1


def test_id_keys():
    ids = [-2 ** 63, -1, 0, 1, 2 ** 63 - 1, "a", "b", "é"]
    keys = [id_key(i) for i in ids]
    assert keys == sorted(keys)
    assert [id_from_key(k) for k in keys] == ids
    for bad in (True, 1.0, None, "", "x" * 256, 2 ** 63, -2 ** 63 - 1, b"x", "\ud800"):
        with pytest.raises(InvalidArgument):
            id_key(bad)


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 63 - 1),
    st.integers(-2 ** 55, 2 ** 55), st.floats(allow_nan=True), st.sampled_from([0.5, 1.0, 1, 2, -0.0, 2.0 ** 53]),
    st.text(max_size=8), st.text(alphabet="ab\x00", max_size=STRING_CUT + 3),
)


def _kind_rank(v):
    return 0 if v is None else 3 if isinstance(v, bool) else 1 if isinstance(v, (int, float)) else 2


@PROPERTY
@given(scalars, scalars)
def test_value_keys_preserve_order(a, b):
    ka, kb = value_key(a), value_key(b)
    if ka is None or kb is None:
        assert isinstance(a, float) and math.isnan(a) or isinstance(b, float) and math.isnan(b)
        return
    if _kind_rank(a) != _kind_rank(b):
        assert (ka < kb) == (_kind_rank(a) < _kind_rank(b))
    elif isinstance(a, str) and (is_truncated(ka) or is_truncated(kb)):
        if a < b:
            assert ka <= kb
    elif a is not None:
        assert (ka < kb) == (a < b) and (ka == kb) == (a == b)


@PROPERTY
@given(st.lists(scalars, min_size=1, max_size=6))
def test_bson_index_keys_twins_agree_with_value_key(values):
    doc = {f"k{i}": v for i, v in enumerate(values)}
    doc["nested"] = {"arr": values}
    raw = bson.encode(doc)
    paths = [(f"k{i}".encode(),) for i in range(len(values))] + [(b"nested", b"arr", str(i).encode())
                                                                 for i in range(len(values))] + [(b"nope",)]
    want = [value_key(v) for v in values] * 2 + [None]
    for impl in _twins():
        assert impl.bson_index_keys(raw, paths) == want
        got = impl.bson_values(raw, paths)
        assert got[-1] is ...
        for g, v in zip(got, values):
            assert g == v or (g != g and v != v)


# -------------------------------------------------------------------------------- raw matcher vs Python

field_names = st.sampled_from(["a", "b", "c"])
leaf_values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2 ** 62, -2 ** 62, 2 ** 53 + 1]),
    st.floats(-3, 3), st.sampled_from([0.5, float("nan"), float("inf"), -0.0]),
    st.sampled_from(["", "a", "ab", "b", "é", "a\x00"]), st.binary(max_size=2),
)
values = st.recursive(leaf_values, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(field_names, inner, max_size=3)), max_leaves=6)
docs = st.dictionaries(field_names, values, max_size=3)
paths = st.sampled_from(["a", "b", "c", "a.b", "b.a", "a.0", "c.1.a"])


def predicates():
    leaf = st.one_of(
        st.builds(Eq, paths, values), st.builds(Ne, paths, values),
        st.builds(Lt, paths, leaf_values), st.builds(Le, paths, leaf_values),
        st.builds(Gt, paths, leaf_values), st.builds(Ge, paths, leaf_values),
        st.builds(In, paths, st.lists(values, max_size=3)), st.builds(Nin, paths, st.lists(values, max_size=3)),
        st.builds(Exists, paths, st.booleans()),
        st.builds(Regex, paths, st.sampled_from(["a", "^a", "b$", "."]), st.sampled_from(["", "i"])),
        st.builds(Contains, paths, st.sampled_from(["", "a", "b"])), st.just(TRUE),
    )
    return st.recursive(leaf, lambda inner: st.one_of(
        st.builds(And, st.lists(inner, max_size=3)), st.builds(Or, st.lists(inner, max_size=3)),
        st.builds(Not, inner)), max_leaves=6)


@PROPERTY
@given(docs, predicates())
def test_raw_matcher_twins_agree_with_the_evaluator(doc, node):
    raw = bson.encode(doc)
    decoded = bson.decode(raw)
    want = compile_predicate(node)(decoded)
    prog = raw_program(node)
    results = {impl.__name__: impl.DocMatcher(prog).match(raw) for impl in _twins()}
    assert len(set(results.values())) == 1, results
    r = next(iter(results.values()))
    assert r == -1 or bool(r) is want, (r, want)


def test_raw_matcher_resolves_scalar_predicates_without_python():
    """Unknown (-1) is only for what needs Python: non-scalar literals and huge ints."""
    raw = bson.encode({"a": 1, "s": "x", "d": {"e": 2}, "t": bson.datetime.datetime(2020, 1, 1)})
    for impl in _twins():
        for node in (Eq("a", 1), Gt("s", "a"), Eq("d.e", 2.0), Eq("t", 1), Exists("z"), Regex("s", "x")):
            assert impl.DocMatcher(raw_program(node)).match(raw) in (0, 1), node
        assert impl.DocMatcher(raw_program(Eq("d", {"e": 2}))).match(raw) == -1
        assert impl.DocMatcher(raw_program(Eq("a", {"e": 2}))).match(raw) == 0
        assert impl.DocMatcher(raw_program(Gt("a", 2 ** 80))).match(raw) == -1


@pytest.mark.parametrize("program", [(), (99,), (5, (b"a",), 9, 1), (5, ("a",), 0, 1), (5, (b"a",), 0, 2 ** 70),
                                     (2, [(0,)]), (7, (b"a",), "x"), (9, (b"a",), "k"), "x"])
def test_bad_programs_raise_value_error(program):
    for impl in _twins():
        with pytest.raises(ValueError):
            impl.DocMatcher(program)


def test_malformed_documents_are_unknown_not_a_crash():
    raw = bson.encode({"a": 1, "b": "xyz"})
    bad = [raw[:-1], raw[:5], b"\x05\x00\x00\x00", raw[:4] + b"\x02b\x00\xff\xff\xff\x7f" + raw[8:],
           b"\xff\x00\x00\x00\x00"]
    for impl in _twins():
        m = impl.DocMatcher(raw_program(Eq("b", "xyz")))
        for b in bad:
            assert m.match(b) in (-1, 0)
            if m.match(b) == -1:
                with pytest.raises(ValueError):
                    impl.bson_index_keys(b, [(b"b",)])


def test_deep_programs_are_refused_alike():
    prog = (0,)
    for _ in range(600):
        prog = (4, prog)
    for impl in _twins():
        with pytest.raises(ValueError, match="deep"):
            impl.DocMatcher(prog)
    prog = (0,)
    for _ in range(400):
        prog = (4, prog)
    for impl in _twins():
        assert impl.DocMatcher(prog).match(bson.encode({})) == 1

"""The document store (riverbed.engine.docstore) over real LMDB environments in tmp_path.

Runs against the compiled core and, with RIVERBED_NO_EXTENSIONS=1, the pure-Python twin. The crash test
SIGKILLs a child process (tests/engine/_docs_crash_child.py) that commits projection steps in a loop and
checks that documents, index entries and the stored position agree exactly afterwards.
"""

import concurrent.futures
import importlib.util
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import bson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from riverbed.engine import DocStore, Engine, InvalidArgument, RiverbedError, StreamNotFound, UniqueViolation
from riverbed.engine.errors import PositionMoved
from riverbed.engine.dockeys import STRING_CUT
from riverbed.engine.predicate import (
    TRUE, And, Contains, Eq, Exists, Ge, Gt, In, Le, Lt, Ne, Nin, Not, Or, Regex, compile_predicate,
)

HELPER = Path(__file__).with_name("_docs_crash_child.py")
_spec = importlib.util.spec_from_file_location("riverbed_tests_docs_crash_child", HELPER)
child_lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(child_lib)


@pytest.fixture
def eng(tmp_path):
    e = Engine(tmp_path / "data", fsync="never", retention_interval=0)
    yield e
    e.close()


@pytest.fixture
def ds(eng):
    return DocStore(eng)


def raw_state(eng):
    """Every key and value of the three document databases, as bytes."""
    out = {}
    with eng.read_txn() as txn:
        for name, db in (("docs", eng._db_docs), ("docidx", eng._db_docidx), ("collections", eng._db_collections)):
            out[name] = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]
    return out


def ids_of(rows):
    return sorted((type(i) is str, i) for i, _ in rows)


# ---------------------------------------------------------------------------------------------- basics


def test_put_get_delete(ds):
    assert ds.put("b", 1, {"x": 1}).result() == 1
    assert ds.put("b", "k", {"y": [1, {"z": None}]}).result() == "k"
    assert ds.get("b", 1) == {"x": 1}
    assert ds.get("b", "k") == {"y": [1, {"z": None}]}
    assert ds.get("b", 2) is None and ds.get("b", "1") is None
    assert ds.get("nope", 1) is None
    assert ds.get_many("b", [1, 2, "k"]) == [{"x": 1}, None, {"y": [1, {"z": None}]}]
    assert ds.put("b", 1, {"x": 2}).result() == 1
    assert ds.get("b", 1) == {"x": 2}
    assert ds.count("b") == 2
    assert ds.delete("b", 1).result() is True
    assert ds.delete("b", 1).result() is False
    assert ds.delete("nope", 1).result() is False
    assert ds.get("b", 1) is None and ds.count("b") == 1
    assert ds.check_collection("b") == []


def test_scan_orders_by_id_ints_numerically_then_strings(ds):
    ids = [5, -3, 2 ** 62, -2 ** 63, 0, 2 ** 63 - 1, "b", "a", "é", "aa", "A", 17]
    ds.put_many("c", [(i, {"i": str(i)}) for i in ids]).result()
    want = sorted(i for i in ids if type(i) is int) + sorted((i for i in ids if type(i) is str),
                                                              key=lambda s: s.encode())
    assert [i for i, _ in ds.scan("c")] == want
    assert [i for i, _ in ds.scan("c", batch=3)] == want
    assert [i for i, _ in ds.scan("c", start=0, limit=4, batch=3)] == want[2:6]
    assert [i for i, _ in ds.scan("c", start="a")] == want[want.index("a"):]
    assert [d["i"] for _, d in ds.scan("c")] == [str(i) for i in want]
    assert list(ds.scan("nope")) == []
    assert [i for i, _ in ds.find("c")] == want


@pytest.mark.parametrize("bad", ["", "x" * 256, "é" * 128, 5, None, b"name", "\ud800"])
def test_bad_collection_names_are_refused_at_once(ds, bad):
    for call in (lambda: ds.put(bad, 1, {}), lambda: ds.get(bad, 1), lambda: ds.create_collection(bad),
                 lambda: ds.drop_collection(bad), lambda: ds.find(bad, TRUE), lambda: ds.delete(bad, 1)):
        with pytest.raises(InvalidArgument):
            call()


@pytest.mark.parametrize("bad", [True, 1.5, None, "", "x" * 256, 2 ** 63, -2 ** 63 - 1, b"id", (1,)])
def test_bad_ids_are_refused_at_once(ds, bad):
    ds.put("c", 1, {}).result()
    for call in (lambda: ds.get("c", bad), lambda: ds.delete("c", bad), lambda: ds.merge("c", bad, {})):
        with pytest.raises(InvalidArgument):
            call()
    if bad is not None:
        with pytest.raises(InvalidArgument):
            ds.put("c", bad, {})
    else:
        with pytest.raises(InvalidArgument, match="id is required"):
            ds.put("c", bad, {}).result()


@pytest.mark.parametrize("doc", [[1], "x", {"a": object()}, {"a": 2 ** 64}, {1: "x"}])
def test_documents_bson_cannot_store_are_refused(ds, doc):
    with pytest.raises(InvalidArgument):
        ds.put("c", 1, doc)
    assert ds.list_collections() == []


def test_collections_list_info_create_and_drop(eng, ds):
    assert ds.create_collection("users", [("email", True), "age", ("addr.city", False)], key_field="uid").result()
    assert ds.create_collection("users", [("email", True), ("age", False), "addr.city"], key_field="uid").result() \
        is False
    with pytest.raises(InvalidArgument, match="exists"):
        ds.create_collection("users", ["age"]).result()
    with pytest.raises(InvalidArgument):
        ds.create_collection("x", ["a", "a"])
    with pytest.raises(InvalidArgument):
        ds.create_collection("x", [("a..b", True)])
    ds.put("binder", "k", {"v": 1}).result()
    assert ds.list_collections() == ["binder", "users"]
    info = ds.collection_info("users")
    assert info.name == "users" and info.key_field == "uid" and info.count == 0
    assert info.indexes == [("email", True), ("age", False), ("addr.city", False)]
    assert ds.collection_info("binder").indexes == [] and ds.collection_info("binder").count == 1
    assert ds.collection_info("nope") is None
    before = raw_state(eng)
    ds.put_many("users", [(None, {"uid": i, "email": f"{i}@x", "age": i % 3, "addr": {"city": "c"}})
                          for i in range(50)]).result()
    assert ds.collection_info("users").count == 50
    assert ds.drop_collection("users").result() is True
    assert ds.drop_collection("users").result() is False
    after = raw_state(eng)
    # nothing of "users" is left: only the next-cid counter moved
    assert after["docs"] == before["docs"] and after["docidx"] == before["docidx"] == []
    assert [k for k, _ in after["collections"]] == [k for k, _ in before["collections"] if not k.startswith(b"Nusers")
                                                    and k != b"C\x00\x00\x00\x01"]
    assert ds.list_collections() == ["binder"] and ds.get("users", 1) is None and ds.find("users", {}) == []
    assert ds.create_collection("users", ["age"]).result() is True
    assert ds.count("users") == 0 and ds.find("users", {"age": 1}) == []


def test_restart_keeps_documents_indexes_and_collections(tmp_path):
    path = tmp_path / "data"
    with Engine(path) as eng:
        ds = DocStore(eng)
        ds.create_collection("p", [("email", True), "n"], key_field="id").result()
        ds.put_many("p", [(None, {"id": f"u{i}", "email": f"e{i}", "n": i % 4}) for i in range(40)]).result()
        ds.put("b", 7, {"a": 1}).result()
        eng.create_stream("s").result()
        ds.apply([("delete", "p", "u0")], position=("s", "proj", 41)).result()
    with Engine(path) as eng:
        ds = DocStore(eng)
        assert ds.list_collections() == ["b", "p"]
        assert ds.collection_info("p").count == 39 and ds.position("s", "proj") == 41
        assert ds.explain("p", {"n": 2})["plan"] == "index"
        assert ids_of(ds.find("p", {"n": 2})) == ids_of((f"u{i}", 0) for i in range(2, 40, 4))
        assert ds.get("p", "u5") == {"id": "u5", "email": "e5", "n": 1} and ds.get("b", 7) == {"a": 1}
        with pytest.raises(UniqueViolation):
            ds.put("p", None, {"id": "new", "email": "e3"}).result()
        assert ds.check_collection("p") == [] and ds.check_collection("b") == []


def test_two_stores_of_one_engine_see_each_others_collections(eng):
    # a writable store answers reads from its engine's committed collections in memory: a store that
    # missed another's create, or its drop and re-create (a new collection id), would answer wrongly
    first, second = DocStore(eng), DocStore(eng)
    first.create_collection("p", ["n"]).result()
    first.put("p", 1, {"n": 1}).result()
    assert second.list_collections() == ["p"] and second.get("p", 1) == {"n": 1}
    first.drop_collection("p").result()
    first.create_collection("p", [("n", True)]).result()
    first.put("p", 2, {"n": 2}).result()
    assert second.get("p", 1) is None and second.get("p", 2) == {"n": 2}
    assert second.collection_info("p") == ("p", None, [("n", True)], 1)
    with pytest.raises(UniqueViolation):
        second.put("p", 3, {"n": 2}).result()


def test_stores_of_two_engines_share_nothing(tmp_path):
    with Engine(tmp_path / "a", fsync="never") as a, Engine(tmp_path / "b", fsync="never") as b:
        da, db = DocStore(a), DocStore(b)
        da.create_collection("p", ["n"]).result()
        da.put("p", 1, {"n": "a"}).result()
        assert db.list_collections() == [] and db.get("p", 1) is None
        db.put("p", 1, {"n": "b"}).result()
        da.drop_collection("p").result()
        assert db.get("p", 1) == {"n": "b"} and da.get("p", 1) is None
        assert DocStore(b).get("p", 1) == {"n": "b"}


def test_a_read_only_engine_reads_and_refuses_writes(tmp_path):
    path = tmp_path / "data"
    with Engine(path) as eng:
        ds = DocStore(eng)
        ds.create_collection("p", ["n"]).result()
        ds.put_many("p", [(i, {"n": i % 2}) for i in range(10)]).result()
    with Engine(path, readonly=True) as ro:
        ds = DocStore(ro)
        assert ds.list_collections() == ["p"] and ds.collection_info("p").count == 10
        assert ids_of(ds.find("p", {"n": 1})) == ids_of((i, 0) for i in range(1, 10, 2))
        assert ds.get("p", 3) == {"n": 1} and ds.get("q", 3) is None
        with pytest.raises(RiverbedError):
            ds.put("p", 1, {})


def test_key_field(ds):
    ds.create_collection("p", ["n"], key_field="k.id").result()
    assert ds.put("p", None, {"k": {"id": 5}, "n": 1}).result() == 5
    assert ds.put("p", "x", {"k": {"id": "x"}}).result() == "x"
    assert ds.get("p", 5) == {"k": {"id": 5}, "n": 1}
    for doc_id, doc in [(None, {"n": 1}), (None, {"k": {"id": 1.5}}), (None, {"k": {"id": True}}),
                        (6, {"k": {"id": 5}}), ("5", {"k": {"id": 5}}), (None, {"k": {"id": ""}})]:
        with pytest.raises(InvalidArgument):
            ds.put("p", doc_id, doc).result()
    assert ds.explain("p", {"k.id": 5}) == {"plan": "ids", "ids": 1}
    assert ds.explain("p", {"k.id": {"$in": [5, "x", 5.0, 6.5, None]}}) == {"plan": "ids", "ids": 2}
    assert ids_of(ds.find("p", {"k.id": {"$in": [5, "x", 5.0, 6.5, None]}})) == ids_of([(5, 0), ("x", 0)])
    assert ds.explain("p", {"k.id": 1.5}) == {"plan": "empty"} and ds.find("p", {"k.id": 1.5}) == []
    with pytest.raises(InvalidArgument, match="differs"):
        ds.update_where("p", {"k.id": 5}, lambda d: {**d, "k": {"id": 9}}).result()
    assert ds.get("p", 5) == {"k": {"id": 5}, "n": 1} and ds.check_collection("p") == []


# ---------------------------------------------------------------------------------- indexes and plans


def test_explain_says_which_plan(ds):
    ds.create_collection("c", ["a", ("u", True), "s"]).result()
    ds.put_many("c", [(i, {"a": i % 10, "u": i, "s": f"s{i}", "d": i % 3}) for i in range(100)]).result()
    ex = ds.explain
    assert ex("c", Eq("a", 3)) == {"plan": "index", "index": "a", "unique": False, "ranges": 1}
    assert ex("c", Eq("u", 3))["unique"] is True
    assert ex("c", In("a", [1, 2, 2.0]))["ranges"] == 2
    assert ex("c", {"a": {"$gt": 2, "$lte": 5}}) == {"plan": "index", "index": "a", "unique": False, "ranges": 1}
    assert ex("c", {"d": 1, "a": {"$gt": 8}})["index"] == "a"
    assert ex("c", {"a": {"$gt": 8}, "u": 5})["index"] == "u"
    assert ex("c", {"$or": [{"a": 1}, {"u": {"$lt": 3}}]})["plan"] == "union"
    assert ex("c", {"$or": [{"a": 1}, {"d": 1}]})["plan"] == "scan"
    assert ex("c", {"a": {"$gt": 5, "$lt": 2}}) == {"plan": "empty"}
    assert ex("c", {"a": {"$gt": 5, "$lt": "z"}}) == {"plan": "empty"}
    assert ex("c", {"a": {"$in": []}}) == {"plan": "empty"}
    for q in ({"a": {"$ne": 1}}, {"d": 1}, {"a": {"$nin": [1]}}, {"a": {"x": 1}}, {"a": float("nan")},
              Not(Eq("a", 1)), Regex("s", "s1"), Exists("a"), {}):
        assert ex("c", q) == {"plan": "scan"}, q
    assert ex("nope", {"a": 1})["plan"] == "empty"
    assert len(ds.find("c", {"a": 3})) == 10 and len(ds.find("c", {"a": 3}, limit=4)) == 4
    assert ds.count("c", {"a": {"$gt": 2, "$lte": 5}}) == 30 and ds.count("c", {"d": 0}) == 34
    assert ds.find_one("c", {"u": 42}) == (42, {"a": 2, "u": 42, "s": "s42", "d": 0})


def test_updates_move_index_entries(ds):
    ds.create_collection("c", ["a", ("u", True)]).result()
    ds.put("c", 1, {"a": 1, "u": "x"}).result()
    ds.put("c", 1, {"a": 2, "u": "y"}).result()
    assert ds.find("c", {"a": 1}) == [] and ds.find("c", {"u": "x"}) == []
    assert ds.find("c", {"a": 2}) == [(1, {"a": 2, "u": "y"})]
    ds.put("c", 2, {"a": 2, "u": "x"}).result()            # "x" was freed by the update
    ds.put("c", 1, {"b": 1}).result()                       # fields gone: entries gone
    assert ds.find("c", {"a": 2}) == [(2, {"a": 2, "u": "x"})] and ds.find("c", {"u": "y"}) == []
    ds.merge("c", 1, {"a": 7}).result()
    assert ds.get("c", 1) == {"b": 1, "a": 7} and ds.find("c", {"a": 7}) == [(1, {"b": 1, "a": 7})]
    assert ds.update_where("c", {"a": {"$gte": 2}}, lambda d: {**d, "a": d["a"] * 10}).result() == 2
    assert ids_of(ds.find("c", {"a": {"$in": [20, 70]}})) == [(False, 1), (False, 2)]
    assert ds.delete_where("c", {"a": 70}).result() == 1
    assert ds.find("c", {}) == [(2, {"a": 20, "u": "x"})]
    assert ds.check_collection("c") == []


def test_long_strings_share_index_keys_but_not_answers(ds):
    ds.create_collection("c", ["s", ("u", True)]).result()
    p = "x" * STRING_CUT
    ds.put_many("c", [(1, {"s": p + "a", "u": p + "a"}), (2, {"s": p + "b", "u": p + "b"}),
                      (3, {"s": p, "u": p}), (4, {"s": p + "c", "u": 1})]).result()
    assert ds.find("c", {"s": p + "b"}) == [(2, {"s": p + "b", "u": p + "b"})]
    assert ids_of(ds.find("c", {"s": {"$gt": p + "a"}})) == [(False, 2), (False, 4)]
    assert ids_of(ds.find("c", {"s": {"$lte": p + "a"}})) == [(False, 1), (False, 3)]
    with pytest.raises(UniqueViolation) as e:
        ds.put("c", 5, {"u": p + "b"}).result()
    assert e.value.holder == 2 and e.value.field == "u" and e.value.value == p + "b"
    ds.put("c", 5, {"u": p + "d"}).result()
    ds.put("c", 2, {"u": p + "b", "s": "short"}).result()            # its own value: no violation
    assert ds.check_collection("c") == []


def test_numbers_compare_as_numbers_in_indexes(ds):
    ds.create_collection("c", ["n"]).result()
    vals = [1, 1.0, 1.5, 2, 2 ** 53, 2 ** 53 + 1, float(2 ** 53), -0.0, 0, float("inf"), float("nan"), True, None,
            "1", -2 ** 63, 2 ** 63 - 1]
    ds.put_many("c", [(i, {"n": v}) for i, v in enumerate(vals)]).result()
    for q in (Eq("n", 1), Eq("n", 2 ** 53), Eq("n", 2 ** 53 + 1), Gt("n", 1), Lt("n", 1.5), Ge("n", 2 ** 53),
              Eq("n", 0), In("n", [1, True, "1", None]), Le("n", None), Gt("n", 2 ** 70), Lt("n", -2 ** 70),
              Gt("n", 2 ** 63 - 2), Eq("n", float("nan"))):
        want = [i for i, v in enumerate(vals) if compile_predicate(q)({"n": v})]
        assert sorted(i for i, _ in ds.find("c", q)) == want, q
        assert sorted(i for i, _ in ds.find("c", q, use_indexes=False)) == want, q


# ------------------------------------------------------------------------------ unique: nothing behind


def test_unique_violations_are_refused_and_leave_nothing_behind(eng, ds):
    ds.create_collection("c", [("email", True), "n"]).result()
    ds.put_many("c", [(i, {"email": f"e{i}", "n": i}) for i in range(5)]).result()
    before = raw_state(eng)

    def refused(fut, holder):
        with pytest.raises(UniqueViolation) as e:
            fut.result()
        assert e.value.collection == "c" and e.value.field == "email" and e.value.holder == holder
        assert raw_state(eng) == before
        assert ds.check_collection("c") == []

    refused(ds.put("c", 9, {"email": "e1", "n": 9}), 1)
    refused(ds.put("c", 2, {"email": "e3"}), 3)                              # an update onto a taken value
    refused(ds.put_many("c", [(10, {"email": "new1"}), (11, {"email": "e4"}), (12, {"email": "new2"})]), 4)
    refused(ds.put_many("c", [(10, {"email": "same"}), (11, {"email": "same"})]), 10)   # within the batch
    refused(ds.update_where("c", {"n": {"$gte": 3}}, lambda d: {**d, "email": "one"}), 3)
    refused(ds.update_where("c", {"n": 0}, lambda d: {**d, "email": "e2"}), 2)
    refused(ds.merge("c", 0, {"email": "e1"}), 1)
    refused(ds.apply([("put", "c", 20, {"email": "fresh"}), ("put", "c", 21, {"email": "e0"})]), 0)
    # a new collection made by a refused write is not kept either
    refused(ds.apply([("put", "other", 1, {"x": 1}), ("put", "c", 22, {"email": "e0"})]), 0)
    assert ds.list_collections() == ["c"] and ds.get("other", 1) is None
    # values that are fine: the same id keeping its value, a freed value, null vs missing
    ds.put("c", 1, {"email": "e1", "n": 100}).result()
    ds.put("c", 1, {"email": "moved"}).result()
    ds.put("c", 9, {"email": "e1"}).result()
    ds.put_many("c", [(30, {"n": 1}), (31, {"n": 2})]).result()            # missing: not indexed
    ds.put("c", 32, {"email": None}).result()
    refused_state = raw_state(eng)
    with pytest.raises(UniqueViolation):
        ds.put("c", 33, {"email": None}).result()
    assert raw_state(eng) == refused_state
    assert ds.check_collection("c") == []


def test_a_failing_write_does_not_disturb_others_in_the_same_group_commit(ds):
    ds.create_collection("c", [("u", True)]).result()
    futs = [ds.put("c", i, {"u": i % 50}) for i in range(100)]
    ok = [f for f in futs if f.exception() is None]
    bad = [f for f in futs if f.exception() is not None]
    assert len(ok) == 50 and all(isinstance(f.exception(), UniqueViolation) for f in bad)
    assert ds.count("c") == 50 and ds.check_collection("c") == []


# ---------------------------------------------------------------------------- staging and positions


def test_apply_commits_documents_and_position_together(eng, ds):
    eng.create_stream("events").result()
    assert ds.position("events", "proj") is None
    res = ds.apply([("put", "p", 1, {"a": 1}), ("merge", "p", 1, {"b": 2}), ("put", "p", 2, {"a": 2}),
                    ("delete", "p", 2), ("delete", "p", 3), ("update_where", "p", {"a": 1}, lambda d: {**d, "c": 3}),
                    ("delete_where", "p", {"zz": 1})], position=("events", "proj", 10)).result()
    assert res == [1, {"a": 1, "b": 2}, 2, True, False, 1, 0]
    assert ds.get("p", 1) == {"a": 1, "b": 2, "c": 3} and ds.position("events", "proj") == 10
    before = raw_state(eng)
    with pytest.raises(StreamNotFound):
        ds.apply([("put", "p", 5, {"a": 5})], position=("nope", "proj", 11)).result()
    with pytest.raises(ZeroDivisionError):
        ds.apply([("put", "p", 5, {"a": 5}), ("update_where", "p", {}, lambda d: 1 / 0)],
                 position=("events", "proj", 11)).result()
    assert raw_state(eng) == before and ds.position("events", "proj") == 10
    for bad in ([("frob", "p")], [("put", "p", 1)], ["put"], [("delete", "", 1)]):
        with pytest.raises(InvalidArgument):
            ds.apply(bad)
    with pytest.raises(InvalidArgument):
        ds.apply([], position=("events", "proj", -1))


def test_apply_after_refuses_a_step_whose_position_moved(eng, ds):
    """``after``: of two runners of one projection (a cluster moving it), the one continuing from an older
    position changes nothing."""
    eng.create_stream("events").result()
    ds.apply([("put", "p", 1, {"v": 1})], position=("events", "proj", 5), after=None).result()
    before = raw_state(eng)
    for stale in (None, 4):
        with pytest.raises(PositionMoved):
            ds.apply([("put", "p", 1, {"v": 0})], position=("events", "proj", 9), after=stale).result()
    assert raw_state(eng) == before and ds.get("p", 1) == {"v": 1}
    ds.apply([("put", "p", 1, {"v": 2})], position=("events", "proj", 9), after=5).result()
    assert ds.get("p", 1) == {"v": 2} and ds.position("events", "proj") == 9
    with pytest.raises(StreamNotFound):
        ds.position("nope", "proj")


def test_staging_inside_a_callers_transaction(eng, ds):
    eng.create_stream("events").result()

    def step(ctx):
        assert ds.stage_put(ctx, "p", 1, {"n": 1}) == 1
        assert ds.stage_get(ctx, "p", 1) == {"n": 1}
        assert ds.stage_merge(ctx, "p", 1, {"m": 2}) == {"n": 1, "m": 2}
        ds.stage_put_many(ctx, "p", [(2, {"n": 2}), (3, {"n": 3})])
        assert ds.stage_delete(ctx, "p", 3) is True
        assert [i for i, _ in ds.stage_find(ctx, "p", {"n": {"$gte": 1}})] == [1, 2]
        ds.stage_create_collection(ctx, "q", ["k"])
        ds.stage_put(ctx, "q", "a", {"k": 1})
        assert ds.stage_update_where(ctx, "q", {"k": 1}, lambda d: {"k": 2}) == 1
        ctx.store_offset("events", "proj", 3)
        return "done"
    assert eng.transact(step).result() == "done"
    assert ds.get("p", 1) == {"n": 1, "m": 2} and ds.count("p") == 2 and ds.position("events", "proj") == 3
    assert ds.find("q", {"k": 2}) == [("a", {"k": 2})]
    before = raw_state(eng)

    def broken(ctx):
        ds.stage_put(ctx, "p", 9, {"n": 9})
        ds.stage_drop_collection(ctx, "q")
        ds.stage_create_collection(ctx, "r")
        ctx.store_offset("events", "proj", 4)
        raise RuntimeError("projection bug")
    with pytest.raises(RuntimeError, match="projection bug"):
        eng.transact(broken).result()
    assert raw_state(eng) == before and ds.list_collections() == ["p", "q"]
    assert ds.position("events", "proj") == 3 and ds.get("p", 9) is None

    # many transactions meeting in one group commit, one of them failing
    def good(i):
        return lambda ctx: ds.stage_put(ctx, "p", 100 + i, {"n": i})
    futs = [eng.transact(good(i)) for i in range(50)] + [eng.transact(broken)] + \
        [eng.transact(good(i)) for i in range(50, 60)]
    assert sorted(f.result() for f in futs if f.exception() is None) == list(range(100, 160))
    assert ds.count("p") == 62 and ds.check_collection("p") == [] and ds.list_collections() == ["p", "q"]


def test_writes_from_many_threads(ds):
    ds.create_collection("c", ["t", ("u", True)]).result()

    def writer(t):
        futs = [ds.put("c", t * 1000 + i, {"t": t, "u": f"{t}-{i}"}) for i in range(200)]
        futs.append(ds.delete_where("c", {"t": t, "u": {"$in": [f"{t}-{i}" for i in range(0, 200, 10)]}}))
        return [f.result() for f in futs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(writer, range(4)))
    assert ds.count("c") == 4 * 180 and ds.check_collection("c") == []
    assert len(ds.find("c", {"t": 2})) == 180


# ------------------------------------------------------------------------ index answers == scan answers

FIELDS = ["a", "b.c", "s"]
scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2 ** 53 + 1, -2 ** 62, 2 ** 63 - 1]),
    st.sampled_from([0.5, 1.0, -0.0, 2.5, float("inf"), float("nan"), 1e300]),
    st.sampled_from(["", "a", "ab", "b", "B", "a\x00", "é", "x" * STRING_CUT + "1", "x" * STRING_CUT + "2"]),
)
value = st.one_of(scalar, st.lists(scalar, max_size=2), st.dictionaries(st.sampled_from(["c", "d"]), scalar,
                                                                        max_size=2))


@st.composite
def documents(draw):
    doc = {}
    for f in ("a", "s", "d"):
        if draw(st.booleans()):
            doc[f] = draw(value)
    b = draw(st.sampled_from(["missing", "scalar", "doc"]))
    if b == "scalar":
        doc["b"] = draw(scalar)
    elif b == "doc":
        doc["b"] = {"c": draw(value)} if draw(st.booleans()) else {}
    return doc


paths = st.sampled_from(FIELDS + ["d", "b"])
predicate = st.recursive(
    st.one_of(
        st.builds(Eq, paths, value), st.builds(Ne, paths, scalar),
        st.builds(Lt, paths, scalar), st.builds(Le, paths, scalar),
        st.builds(Gt, paths, scalar), st.builds(Ge, paths, scalar),
        st.builds(In, paths, st.lists(scalar, max_size=3)), st.builds(Nin, paths, st.lists(scalar, max_size=3)),
        st.builds(Exists, paths, st.booleans()), st.builds(Contains, paths, st.sampled_from(["a", "x"])),
        st.builds(Regex, paths, st.sampled_from(["^a", "b", "X"]), st.sampled_from(["", "i"])),
    ),
    lambda inner: st.one_of(st.builds(And, st.lists(inner, min_size=1, max_size=3)),
                            st.builds(Or, st.lists(inner, min_size=1, max_size=3)), st.builds(Not, inner)),
    max_leaves=5)


@pytest.fixture
def shared_store(tmp_path):
    eng = Engine(tmp_path / "hyp", fsync="never", retention_interval=0)
    yield DocStore(eng), iter(range(10 ** 9))
    eng.close()


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(documents(), max_size=25), st.lists(predicate, min_size=1, max_size=4))
def test_index_answers_equal_full_scan_answers(shared_store, docs, preds):
    ds, counter = shared_store
    name = f"h{next(counter)}"
    ds.create_collection(name, [(f, False) for f in FIELDS]).result()
    ds.put_many(name, list(enumerate(docs))).result()
    stored = [bson.decode(bson.encode(d)) for d in docs]
    for node in preds:
        event(f"plan {ds.explain(name, node)['plan']}")
        want = [i for i, d in enumerate(stored) if compile_predicate(node)(d)]
        via_plan = sorted(i for i, _ in ds.find(name, node))
        via_scan = [i for i, _ in ds.find(name, node, use_indexes=False)]
        assert via_plan == want, (node, ds.explain(name, node))
        assert via_scan == want, node
        assert ds.count(name, node) == len(want)
        for i, doc in ds.find(name, node):
            assert bson.encode(doc) == bson.encode(stored[i])          # NaN != NaN, so not ==
    assert ds.check_collection(name) == []
    ds.drop_collection(name).result()


# ------------------------------------------------------------------------------------------ crash test


class Child:
    """The crash helper as a child process; its stdout lines are collected by a thread."""

    def __init__(self, tmp_path, *args):
        self.stderr_path = tmp_path / f"child-{time.monotonic_ns()}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, str(HELPER), *map(str, args)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, env=dict(os.environ),
                                     text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.endswith("\n"):
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix, timeout=60):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"child said nothing for {timeout} s; stderr:\n{self.stderr_path.read_text()}")
        if line is None or not line.startswith(prefix):
            pytest.fail(f"child said {line!r}, expected {prefix!r}; stderr:\n{self.stderr_path.read_text()}")
        return line.split()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._stderr.close()
        acked = []
        while True:
            line = self.lines.get(timeout=30)
            if line is None:
                return acked
            acked.append(line)


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["batch", "always"])
def test_sigkill_between_writes_leaves_documents_indexes_and_position_consistent(tmp_path, fsync):
    path = tmp_path / "data"
    rnd = random.Random(fsync)
    last_acked = 0
    for _ in range(4):
        child = Child(tmp_path, "project", path, fsync)
        start = int(child.expect("start")[1])
        assert start >= last_acked, "an acknowledged step was lost"
        time.sleep(rnd.uniform(0.3, 1.2))
        lines = child.kill()
        steps = [int(x) for x in lines if x.isdigit()]
        assert not [x for x in lines if not x.isdigit()], lines
        assert steps, "the child committed nothing"
        last_acked = max(steps)
        with Engine(path, fsync="never") as eng:
            ds = DocStore(eng)
            pos = ds.position("events", "proj")
            # every acknowledged step is there (a process crash loses nothing acknowledged), and the
            # documents are exactly those of the steps up to the position: no more, no less
            assert pos >= last_acked
            for name in child_lib.COLLECTIONS:
                assert ds.check_collection(name) == [], name
            assert child_lib.snapshot(ds) == child_lib.replay(pos)
            assert ds.get("state", "counter") == {"id": "counter", "step": pos}
            # and the store goes on working on top of what the crash left
            email = child_lib.some_email(child_lib.replay(pos))
            if email is not None:
                with pytest.raises(UniqueViolation):
                    ds.put("items", None, {"id": 10 ** 6, "email": email}).result()
        last_acked = pos

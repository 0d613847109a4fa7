"""The document changelog (shells/cluster/docs.py) in one process, without etcd: what a node logs for its
document writes, replayed by another node's DocLog, gives the same documents, indexes and unique keys.

The node here is the only member of its streams (``OneMember``: it leads every stream and a majority
of one holds whatever it stores), so the broker, the engines and the changelog are all real; only the
other members are missing. The three-node behaviour is tests/cluster/test_docstore.py."""

import asyncio
import shutil

import bson
import pytest

from riverbed.engine import Engine
from riverbed.engine.errors import ChunkError, UniqueViolation
from riverbed.shells.broker import Broker
from riverbed.shells.cluster.docs import CHANGELOG, DocLog
from riverbed.shells.ream_text import expr as X
from riverbed.shells.ream_text.aggregates import Aggregates
from riverbed.shells.ream_text.projections import Projections, parse_fields

COMMITTED = 1 << 60


class OneMember:
    """The ClusterNode surface the broker and the DocLog use, for a node that is its streams' only member."""

    replication_timeout = 5.0

    def __init__(self, name):
        self.name = name
        self.placements = {}
        self.leading = {CHANGELOG: None}
        self.forwarding = self          # no other node: nothing is placed elsewhere, nothing forwarded

    def lookup(self, stream, cb):
        cb(False, None)

    def placed(self, stream):
        return False

    def check_write(self, stream):
        return None

    def hold(self, stream, cb):
        return cb

    def hold_create(self, names, cb):
        return cb


def node(tmp_path, name, snapshot_every=0):
    loop = asyncio.get_running_loop()
    eng = Engine(str(tmp_path / name), fsync="never")
    eng.set_read_limit(CHANGELOG, COMMITTED)      # what a member's COMMIT frames do
    broker = Broker(eng, post=loop.call_soon_threadsafe, post_local=loop.call_soon)
    broker.cluster = OneMember(name)
    doclog = DocLog(broker, broker.cluster, snapshot_every=snapshot_every)
    doclog.start()
    return eng, broker, doclog


def call(fn, *args):
    fut = asyncio.get_running_loop().create_future()
    fn(*args, lambda res, exc: fut.set_exception(exc) if exc else fut.set_result(res))
    return fut


async def settle(doclog, upto, timeout=5.0):
    for _ in range(int(timeout / 0.02)):
        if doclog.applied >= upto:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"applied {doclog.applied}, wanted {upto}")


def test_a_nodes_changelog_replayed_elsewhere_gives_the_same_documents(tmp_path):
    async def main():
        eng_a, broker_a, log_a = node(tmp_path, "a")
        eng_b, broker_b, log_b = node(tmp_path, "b")
        try:
            aggs = Aggregates(broker_a.docs, broker_a.transact)
            projs = Projections(broker_a.docs, broker_a.transact, lambda fn, cb: cb(fn(), None))
            assert await call(aggs.set, "carts", 12, {"items": 3}) == 12
            assert await call(projs.create, "people", parse_fields("3", ["+name", "+email", "*city"])) is True
            for row in ({"name": "ann", "email": "a@x", "city": "Oslo"}, {"name": "bob", "email": "b@x", "city": "Rome"}):
                await call(projs.set, "people", row)
            with pytest.raises(UniqueViolation):
                await call(projs.set, "people", {"name": "cid", "email": "a@x", "city": "Oslo"})
            assert await call(projs.update, "people", X.compile_where('name = "bob"'),
                              X.compile_update('{"city": "Oslo"}')) == 1
            assert await call(aggs.remove, "carts", 12) is True
            assert await call(aggs.set, "carts", 13, {"items": 1}) == 13
            # each write was applied on the node that took it before it was answered
            assert broker_a.docs.get("carts", 13) == {"items": 1}
            head = eng_a.stream_info(CHANGELOG).next_offset
            assert head == log_a.applied and head >= 6       # the refused SET logged nothing

            # the other node gets the same changelog (a member copies the leader's chunks) and applies it
            records = [bytes(raw) for b in broker_a.read_records(CHANGELOG, 0, 100)[0] for _, raw in b]
            await asyncio.wrap_future(eng_b.create_stream(CHANGELOG))
            await asyncio.wrap_future(eng_b.append(CHANGELOG, records))
            await settle(log_b, head)
            docs_a, docs_b = broker_a.docs, broker_b.docs
            for coll in ("carts", "people", "_ream_projections"):
                assert list(docs_b.scan(coll)) == list(docs_a.scan(coll)), coll
                assert docs_b.collection_info(coll)[:3] == docs_a.collection_info(coll)[:3]
            assert docs_b.get("carts", 12) is None
            assert [d["name"] for _, d in docs_b.find("people", {"city": "Oslo"})] == ["ann", "bob"]
            # the unique index was built there too
            bprojs = Projections(docs_b, broker_b.transact, lambda fn, cb: cb(fn(), None))
            with pytest.raises(UniqueViolation):
                await call(bprojs.set, "people", {"name": "dan", "email": "b@x", "city": "Oslo"})
        finally:
            for lg, eng in ((log_a, eng_a), (log_b, eng_b)):
                await lg.stop()
                eng.close()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_write_planned_against_an_older_state_is_planned_again(tmp_path):
    async def main():
        eng, broker, doclog = node(tmp_path, "a")
        try:
            aggs = Aggregates(broker.docs, broker.transact)
            assert await call(aggs.set, "carts", 1, {"n": 1}) == 1
            head = eng.stream_info(CHANGELOG).next_offset
            # nothing past here is committed for now; another node's write to the same collection is
            # first in the log after it (its leader took it)
            eng.set_read_limit(CHANGELOG, head)
            other = {"v": 1, "token": "elsewhere:1", "node": "b", "reads": [],
                     "ops": [["put", "carts", 2, bson.encode({"n": 2})]]}
            await asyncio.wrap_future(eng.append(CHANGELOG, [bson.encode(other)]))
            # this node plans its write against the state before that record, and logs it after it
            write = call(aggs.set, "carts", 1, {"n": 10})
            await asyncio.sleep(0.3)
            assert not write.done() and doclog.stats["conflicts"] == 0
            eng.set_read_limit(CHANGELOG, COMMITTED)
            assert await write == 1
            # applied in log order: the other write, this one refused (conflict), then planned again
            assert doclog.stats["conflicts"] == 1 and doclog.stats["planned"] == 3
            assert broker.docs.get("carts", 2) == {"n": 2} and broker.docs.get("carts", 1) == {"n": 10}
            assert eng.stream_info(CHANGELOG).next_offset == head + 3
            # a record sent twice (its leader went away after storing it, and the writer sent it again)
            # changes nothing the second time: the versions it read are gone
            assert await call(aggs.set, "carts", 1, {"n": 11}) == 1
            last = [bytes(raw) for b in broker.read_records(CHANGELOG, head + 3, 10)[0] for _, raw in b]
            assert len(last) == 1
            assert await call(aggs.set, "carts", 1, {"n": 12}) == 1
            await asyncio.wrap_future(eng.append(CHANGELOG, last))
            await settle(doclog, head + 6)
            assert broker.docs.get("carts", 1) == {"n": 12}
        finally:
            await doclog.stop()
            eng.close()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_compaction_snapshots_drop_the_head_and_a_new_copy_loads_the_same_state(tmp_path):
    """Many writes with a snapshot every 40 changelog records: the head of the log goes, and a node whose
    copy starts at the leader's first chunk (what replication gives a new or wiped node) loads the
    snapshot, replays the rest and ends with the same documents, indexes, versions and unique keys."""
    async def main():
        eng_a, broker_a, log_a = node(tmp_path, "a", snapshot_every=40)
        eng_b, broker_b, log_b = node(tmp_path, "b")
        try:
            aggs = Aggregates(broker_a.docs, broker_a.transact)
            projs = Projections(broker_a.docs, broker_a.transact, lambda fn, cb: cb(fn(), None))
            assert await call(projs.create, "people", parse_fields("3", ["+name", "+email", "*city"])) is True
            for i in range(150):
                await call(aggs.set, "carts", i % 37, {"n": i})
                if i % 3 == 0:
                    await call(projs.set, "people", {"name": f"p{i}", "email": f"{i}@x", "city": f"c{i % 4}"})
                if i % 10 == 9:
                    await call(aggs.remove, "carts", (i * 7) % 37)
            await settle(log_a, eng_a.stream_info(CHANGELOG).next_offset)
            for _ in range(100):
                if log_a.compaction.stats["trims"] >= 2 and eng_a.stream_info(CHANGELOG).first_chunk_id > 0:
                    break
                await asyncio.sleep(0.05)
            comp = log_a.compaction.stats
            assert comp["snapshots"] >= 3 and comp["trims"] >= 2, comp
            info = eng_a.stream_info(CHANGELOG)
            assert info.first_chunk_id > 0 and info.first_chunk_id <= log_a.compaction.last_base

            # a new copy: the leader's log from its first chunk, replicated as stored
            await asyncio.wrap_future(eng_b.create_stream(CHANGELOG))
            frm = 0
            while True:
                got, _ = eng_a.read_for_replica(CHANGELOG, frm)
                if not got:
                    break
                for chunk_id, raw in got:
                    if frm == 0:
                        with pytest.raises(ChunkError):
                            # a gap, unless the member says its copy starts here (replication.py does)
                            await asyncio.wrap_future(eng_b.replicate_chunk(CHANGELOG, raw))
                    frm = await asyncio.wrap_future(eng_b.replicate_chunk(CHANGELOG, raw, start=frm == 0))
            assert eng_b.stream_info(CHANGELOG).first_chunk_id == info.first_chunk_id
            await settle(log_b, eng_a.stream_info(CHANGELOG).next_offset)
            assert log_b.compaction.stats["loads"] == 1
            docs_a, docs_b = broker_a.docs, broker_b.docs
            names = [n for n in docs_a.list_collections() if n != "_riverbed_changelog"]
            assert "carts" in names and "people" in names and "_riverbed_versions" in names
            assert [n for n in docs_b.list_collections() if n != "_riverbed_changelog"] == names
            for coll in names:
                assert list(docs_b.scan(coll)) == list(docs_a.scan(coll)), coll
                assert docs_b.collection_info(coll)[:4] == docs_a.collection_info(coll)[:4], coll
            # the unique index is there, and a later write through b's store is decided as on a
            bprojs = Projections(docs_b, broker_b.transact, lambda fn, cb: cb(fn(), None))
            with pytest.raises(UniqueViolation):
                await call(bprojs.set, "people", {"name": "zed", "email": "3@x", "city": "c0"})
            # b's own copy drops its head too once it applies the next whole snapshot
            assert log_b.compaction.stats["trims"] >= 0
        finally:
            for lg, eng in ((log_a, eng_a), (log_b, eng_b)):
                await lg.stop()
                eng.close()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_snapshot_cut_short_is_skipped_and_a_load_killed_midway_starts_again(tmp_path):
    """A node loading a snapshot skips one cut short by a failover (parts, no end record), and a load
    stopped between its parts (the node killed) starts again from the first part when the node comes
    back: its applied position moves only at the end record, so nothing half-loaded is ever taken for
    whole."""
    def part(token, i, docs, colls=()):
        return bson.encode({"v": 1, "snap": token, "base": 1, "part": i, "colls": list(colls),
                            "docs": [[c, k, bson.encode(d)] for c, k, d in docs]})
    meta = [["carts", None, []]]

    # the copy as replication leaves it, written before the node starts: offset 0 went (as compaction
    # drops it) and the copy starts at 1
    eng = Engine(str(tmp_path / "b"), fsync="never")
    eng.create_stream(CHANGELOG).result(10)
    eng.append(CHANGELOG, [b"gone"]).result(10)
    eng.append(CHANGELOG, [part("cut", 0, [("carts", 1, {"stale": 1})], meta),
                           part("cut", 1, [("carts", 3, {"stale": 3})])]).result(10)
    eng.trim_head(CHANGELOG, 1).result(10)
    assert eng.stream_info(CHANGELOG).first_chunk_id == 1
    other = {"v": 1, "token": "elsewhere:1", "node": "a", "reads": [],
             "ops": [["put", "carts", 2, bson.encode({"n": 2})]]}
    eng.append(CHANGELOG, [bson.encode(other)]).result(10)
    eng.close()

    async def main():
        eng, broker, doclog = node(tmp_path, "b")
        try:
            whole = [part("whole", 0, [("carts", 1, {"good": 1})], meta),
                     part("whole", 1, [("carts", 4, {"good": 4})])]
            await asyncio.wrap_future(eng.append(CHANGELOG, whole))
            # the parts of the whole snapshot are loaded, its end is not there yet: then the node dies
            for _ in range(100):
                if broker.docs.get("carts", 4) is not None:
                    break
                await asyncio.sleep(0.02)
            assert broker.docs.get("carts", 4) == {"good": 4} and doclog.applied == 0
            assert broker.docs.get("carts", 2) is None
        finally:
            await doclog.stop()
            eng.close()

        # the node comes back (a copy of its data dir: LMDB must not open one path twice in a process)
        shutil.copytree(tmp_path / "b", tmp_path / "b2")
        eng, broker, doclog = node(tmp_path, "b2")
        try:
            assert doclog.applied == 0
            end = bson.encode({"v": 1, "snap": "whole", "base": 1, "end": 2})
            await asyncio.wrap_future(eng.append(CHANGELOG, [end]))
            await settle(doclog, eng.stream_info(CHANGELOG).next_offset)
            assert doclog.compaction.stats["loads"] == 1
            # the whole snapshot, then the record logged after its base; nothing of the cut one
            assert sorted(broker.docs.scan("carts")) == [(1, {"good": 1}), (2, {"n": 2}), (4, {"good": 4})]
        finally:
            await doclog.stop()
            eng.close()
    asyncio.run(asyncio.wait_for(main(), 60))

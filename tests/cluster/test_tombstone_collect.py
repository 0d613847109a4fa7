"""The collection of deletion tombstones (shells/cluster/deletion.py ``collect``) against a real etcd 3.4:
one compare-and-swap per step, so nodes running it at once never undo each other's step, the last holder
deletes the tombstone, and the age bound removes one whatever is still listed. The nodes here are stand-ins
holding what ``collect`` reads of a ClusterNode (its name, etcd client and key prefix, the watched known
nodes, which copies it holds); the whole path on real nodes is in test_stream_delete.py. Last, one node
on a real etcd that loses its data: its copies are placed again, not taken for orphans."""

import asyncio
import os
import shutil
import time

import pytest

from riverbed.shells.cluster import deletion
from riverbed.shells.cluster.etcd import Etcd

PREFIX = "/riverbed/t/"
KEY = PREFIX + "deleted/s"


class _Engine:
    def __init__(self, copies):
        self.copies = set(copies)

    def has_stream(self, name):
        return name in self.copies


class _View:
    def __init__(self, known):
        self.known = known

    def items(self, directory):
        assert directory == "known/"
        return self.known


class _Node:
    def __init__(self, name, etcd, known=(), copies=(), max_age=deletion.DEFAULT_TOMBSTONE_MAX_AGE):
        self.name = name
        self.prefix = PREFIX
        self.etcd = etcd
        self.etcd_view = _View(known)
        self.engine = _Engine(copies)
        self._member_deleting = set()
        self.tombstone_max_age = max_age


def run(coro):
    return asyncio.run(coro)


async def _round(c, nodes):
    """Every node collects at once, all from the same read of the tombstone (the same revision)."""
    kv = await c.get(KEY)
    await asyncio.gather(*(deletion.collect(n, [kv] if kv is not None else [], {}) for n in nodes))
    kv = await c.get(KEY)
    return None if kv is None else kv.json()


def test_holders_take_themselves_off_at_once_one_step_each_and_the_last_deletes(etcd):
    async def go():
        c = Etcd(etcd.url)
        try:
            await c.put(KEY, deletion.tombstone("s", {"members": ["a", "b", "c"], "learners": ["d"]}))
            assert (await c.get(KEY)).json()["holders"] == ["a", "b", "c", "d"]
            nodes = [_Node(n, c) for n in ("a", "b", "c")] + [_Node("d", c, copies=["s"])]
            seen = [["a", "b", "c", "d"]]
            for _ in range(3):
                t = await _round(c, nodes)
                # one CAS won this round: exactly one holder less, never one put back
                assert len(t["holders"]) == len(seen[-1]) - 1 and set(t["holders"]) < set(seen[-1])
                seen.append(t["holders"])
            assert seen[-1] == ["d"]               # d still holds its copy: it stays listed
            assert await _round(c, nodes) == {"name": "s", "holders": ["d"], "at": t["at"]}
            nodes[-1].engine.copies.clear()        # d's copy is gone: the last holder deletes the tombstone
            assert await _round(c, nodes) is None
            assert await _round(c, nodes) is None  # and nothing happens once it is gone
        finally:
            await c.close()
    run(go())


def test_a_tombstone_past_its_max_age_goes_whoever_is_listed(etcd):
    async def go():
        c = Etcd(etcd.url)
        try:
            await c.put(KEY, deletion.tombstone("s", {"members": ["gone"]}, now=time.time() - 100))
            young = [_Node(n, c, max_age=1000) for n in ("a", "b")]
            assert (await _round(c, young))["holders"] == ["gone"]
            old = [_Node(n, c, max_age=60) for n in ("a", "b")]     # both at once: one CAS deletes it
            assert await _round(c, old) is None
        finally:
            await c.close()
    run(go())


def test_a_tombstone_of_an_earlier_version_lists_every_known_node(etcd):
    async def go():
        c = Etcd(etcd.url)
        try:
            await c.put(PREFIX + "known/a", {"name": "a"})
            await c.put(PREFIX + "known/b", {"name": "b"})
            known = await c.get_prefix(PREFIX + "known/")
            await c.put(KEY, {"name": "s"})
            t = await _round(c, [_Node("a", c, known=known)])
            assert t["holders"] == ["a", "b"] and abs(t["at"] - time.time()) < 60
            t = await _round(c, [_Node("a", c, known=known)])
            assert t["holders"] == ["b"]
            # malformed (etcd is shared): taken as one of an earlier version, never a failed reconcile
            await c.put(KEY, {"name": "s", "holders": [1, None], "at": "yesterday"})
            assert (await _round(c, [_Node("b", c, known=known)]))["holders"] == ["a", "b"]
            await c.put(KEY, {"name": ["s"]})
            assert await _round(c, [_Node("b", c, known=known)]) == {"name": ["s"]}
        finally:
            await c.close()
    run(go())


@pytest.mark.integration
def test_copies_are_placed_again_not_dropped_when_etcd_starts_afresh(tmp_path, etcd):
    """A copy that was placed once and is neither placed nor in a tombstone is an orphan only under the
    etcd data it was placed in: should etcd lose its data (a fresh etcd at the same address), the node
    places its stream again with its records, as before incarnation records existed."""
    from clusterproc import Cluster
    from rawwire import OK
    from test_replication import connect, publish_batches, wait_placed

    from riverbed.engine.log import Engine
    from riverbed.shells.cluster import incarnation

    c = Cluster(tmp_path, etcd, n=1)
    try:
        c.start()
        port = c.nodes["n1"].port
        conn = connect(port)
        assert conn.create("kept") == OK
        conn.close()
        wait_placed(c, "kept")
        confirmed, errors = publish_batches(port, "kept", 0, 5, batch=5, ref="k")
        assert errors == {} and len(confirmed) == 5

        def record():
            eng = Engine(str(c.data_dir("n1")), readonly=True)
            try:
                return eng.get_value(eng._db_meta, incarnation.KEY_PREFIX + b"kept")
            finally:
                eng.close()
        deadline = time.monotonic() + 10
        while record() is None:
            assert time.monotonic() < deadline, "no incarnation record for kept"
            time.sleep(0.1)
        c.nodes["n1"].kill()
        etcd.stop()
        shutil.rmtree(os.path.join(etcd.data_dir, "member"))
        etcd.start()
        c.restart("n1")
        wait_placed(c, "kept")
        conn = connect(c.nodes["n1"].port)
        assert conn.read_from_first("kept") == [b"m-%d" % i for i in range(5)]
        conn.close()
    finally:
        c.stop()

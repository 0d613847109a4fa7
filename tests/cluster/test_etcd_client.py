"""The cluster's etcd client (shells/cluster/etcd.py) against a real etcd 3.4."""

import asyncio
import time

import pytest

from riverbed.shells.cluster.etcd import Etcd, EtcdError, WatchLost
from riverbed.shells.cluster.etcdview import EtcdView


def run(coro):
    return asyncio.run(coro)


def test_put_get_prefix_delete(etcd):
    async def go():
        c = Etcd(etcd.url)
        try:
            await c.put("/t/a", {"x": 1})
            await c.put("/t/b", b"raw")
            await c.put("/u/c", "other")
            kv = await c.get("/t/a")
            assert kv.json() == {"x": 1} and kv.mod_revision > 0
            assert [k.key for k in await c.get_prefix("/t/")] == [b"/t/a", b"/t/b"]
            await c.delete("/t/a")
            assert await c.get("/t/a") is None
            await c.delete_prefix("/t/")
            assert await c.get_prefix("/t/") == []
            assert (await c.get("/u/c")).value == b"other"
        finally:
            await c.close()
    run(go())


def test_compare_and_swap(etcd):
    async def go():
        c = Etcd(etcd.url)
        try:
            assert await c.create("/cas", {"epoch": 1})
            assert not await c.create("/cas", {"epoch": 9})      # exists: the second creator loses
            kv = await c.get("/cas")
            assert await c.replace("/cas", kv.mod_revision, {"epoch": 2})
            assert not await c.replace("/cas", kv.mod_revision, {"epoch": 3})   # stale revision
            assert (await c.get("/cas")).json() == {"epoch": 2}
        finally:
            await c.close()
    run(go())


def test_remove_is_one_compare_and_swap_transaction(etcd):
    """A stream's deletion (cluster/deletion.py): the placement goes only at the revision read, and with
    it, in the same transaction, the progress keys go and the tombstone comes; a stale revision changes
    nothing at all."""
    async def go():
        c = Etcd(etcd.url)
        try:
            await c.put("/s/streams/x", {"epoch": 1})
            await c.put("/s/progress/x/n1", {"next": 5})
            await c.put("/s/progress/x/n2", {"next": 5})
            await c.put("/s/progress/xy/n1", {"next": 7})        # another stream's: its prefix differs
            kv = await c.get("/s/streams/x")
            await c.put("/s/streams/x", {"epoch": 2})              # an election meanwhile
            args = dict(puts=[("/s/deleted/x", {"name": "x"})], delete_prefixes=["/s/progress/x/"])
            assert not await c.remove("/s/streams/x", kv.mod_revision, **args)
            assert await c.get("/s/deleted/x") is None and len(await c.get_prefix("/s/progress/x/")) == 2
            kv = await c.get("/s/streams/x")
            assert await c.remove("/s/streams/x", kv.mod_revision, **args)
            assert await c.get("/s/streams/x") is None and await c.get_prefix("/s/progress/x/") == []
            assert (await c.get("/s/deleted/x")).json() == {"name": "x"}
            assert (await c.get("/s/progress/xy/n1")) is not None
        finally:
            await c.close()
    run(go())


def test_lease_keepalive_and_expiry(etcd):
    async def go():
        c = Etcd(etcd.url)
        try:
            lease = await c.grant(1)
            await c.put("/node/a", "up", lease=lease)
            for _ in range(4):      # kept alive past its TTL
                assert await c.keepalive(lease) >= 1
                await asyncio.sleep(0.4)
            assert await c.get("/node/a") is not None
            t0 = time.monotonic()
            while await c.get("/node/a") is not None:      # no keepalive: the key goes with the lease
                assert time.monotonic() - t0 < 5
                await asyncio.sleep(0.1)
            assert await c.keepalive(lease) == 0
            lease2 = await c.grant(5)
            await c.put("/node/b", "up", lease=lease2)
            await c.revoke(lease2)
            assert await c.get("/node/b") is None
        finally:
            await c.close()
    run(go())


def test_unreachable_endpoint_is_skipped_then_error(etcd):
    async def go():
        dead = "http://127.0.0.1:1"
        c = Etcd(f"{dead},{etcd.url}")
        try:
            await c.put("/k", "v")      # the dead endpoint is tried, then the live one
            assert (await c.get("/k")).value == b"v"
        finally:
            await c.close()
        c = Etcd(dead, timeout=0.5)
        try:
            with pytest.raises(EtcdError):
                await c.get("/k")
        finally:
            await c.close()
    run(go())


def test_watch_from_a_read_revision_replays_puts_and_deletes(etcd):
    """A watch from the revision after a read sees every change since that read, in order, and only
    under its prefix."""
    async def go():
        c = Etcd(etcd.url)
        try:
            await c.put("/w/a", "1")
            rev, kvs = await c.read_prefix("/w/")
            assert [k.key for k in kvs] == [b"/w/a"] and rev >= kvs[0].mod_revision
            await c.put("/w/b", {"x": 2})       # after the read, before the watch: replayed
            await c.delete("/w/a")
            await c.put("/wx", "not under /w/")
            assert c.written > rev
            got = []

            async def collect():
                async for events in c.watch("/w/", rev + 1):
                    got.extend(events)
                    if len(got) >= 3:
                        return
            task = asyncio.create_task(collect())
            await asyncio.sleep(0.3)
            await c.put("/w/c", "3")            # while watching
            await asyncio.wait_for(task, 10)
            assert [(e.kv.key, e.deleted) for e in got] == [(b"/w/b", False), (b"/w/a", True), (b"/w/c", False)]
            assert got[0].kv.json() == {"x": 2}
            assert got[0].kv.mod_revision < got[1].kv.mod_revision < got[2].kv.mod_revision == c.written
        finally:
            await c.close()
    run(go())


def test_watch_lost_on_a_compacted_revision_and_when_etcd_stops(etcd):
    async def go():
        c = Etcd(etcd.url)
        try:
            for i in range(3):
                await c.put("/k", str(i))
            rev, _ = await c.read_prefix("/")
            await c._call("/v3/kv/compaction", {"revision": str(rev)}, write=True)
            with pytest.raises(WatchLost, match="compacted"):
                async for _ in c.watch("/", 1):
                    pass

            async def watch():
                async for _ in c.watch("/", rev + 1):
                    pass
            task = asyncio.create_task(watch())
            await asyncio.sleep(0.3)
            assert not task.done()
            await asyncio.to_thread(etcd.stop)
            with pytest.raises(WatchLost):
                await asyncio.wait_for(task, 10)
        finally:
            await c.close()
            await asyncio.to_thread(etcd.start)
    run(go())


def test_view_follows_etcd_through_its_restart(etcd):
    """EtcdView: changes arrive without a read; the node's own write is waited for (catch_up); after etcd
    restarts the copy is read again and watched anew."""
    async def until(cond, what, timeout=10):
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.02)

    async def go():
        changes = []
        c = Etcd(etcd.url)
        view = EtcdView(c, "/riverbed/t/", changes.append, safety=60)
        try:
            await c.put("/riverbed/t/nodes/a", {"name": "a"})
            await c.put("/riverbed/u/nodes/z", {"name": "z"})        # another cluster: not in the copy
            await view.resync()
            view.start()
            await until(lambda: view.current, "the watch")
            await c.put("/riverbed/t/streams/s", {"name": "s"})
            await view.catch_up(c.written)
            assert [kv.json()["name"] for kv in view.items("streams/")] == ["s"]
            assert [kv.json()["name"] for kv in view.items("nodes/")] == ["a"]
            assert view.reads == 1 and {"streams/"} in changes       # brought by the watch, not a read
            await asyncio.to_thread(etcd.stop)
            await until(lambda: not view.current, "the lost watch")
            await asyncio.to_thread(etcd.start)
            await c.delete("/riverbed/t/nodes/a")
            await c.put("/riverbed/t/nodes/b", {"name": "b"})
            await view.catch_up(c.written)
            await until(lambda: [kv.json()["name"] for kv in view.items("nodes/")] == ["b"], "the new node key")
            assert view.reads >= 2 and view.current
            await c.put("/riverbed/t/deleted/s", {"name": "s"})
            await until(lambda: view.items("deleted/"), "a change after the restart")
        finally:
            view.close()
            await c.close()
    run(go())

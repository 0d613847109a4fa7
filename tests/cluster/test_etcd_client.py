"""The cluster's etcd client (shells/cluster/etcd.py) against a real etcd 3.4."""

import asyncio
import time

import pytest

from riverbed.shells.cluster.etcd import Etcd, EtcdError


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

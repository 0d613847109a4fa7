"""rbfly 0.10 (the other real Python client in FACTS) against ``riverbed serve``, when it is installed.
It names its publishers (QueryPublisherSequence), subscribes with credit 128 and match-unfiltered, and
sends Close. Not a declared dependency (Cython build, GPL): ``pip install rbfly==0.10.0`` to run."""

import asyncio

import pytest

rbs = pytest.importorskip("rbfly.streams")

pytestmark = pytest.mark.integration


def test_rbfly_publish_and_subscribe(server):
    async def scenario():
        client = rbs.streams_client(f"rabbitmq-stream://guest:guest@127.0.0.1:{server.port}")
        try:
            await client.create_stream("rbfly")
            async with client.publisher("rbfly") as pub:
                for i in range(100):
                    await pub.send(b"m%d" % i)
            async with client.publisher("rbfly", cls=rbs.PublisherBatchFast) as pub:
                for i in range(100, 1100):
                    pub.batch(b"m%d" % i)
                await pub.flush()
            got = []
            async for msg in client.subscribe("rbfly", offset=rbs.Offset.FIRST):
                got.append(msg)
                if len(got) == 1100:
                    break
            assert got == [b"m%d" % i for i in range(1100)]
            async for msg in client.subscribe("rbfly", offset=rbs.Offset.offset(1050)):
                assert msg == b"m1050"
                break
        finally:
            await client.disconnect()
    asyncio.run(asyncio.wait_for(scenario(), 60))

"""Cross-protocol: the WebSocket JSON listener and the RabbitMQ Stream listener (real rstream 1.1.1) on one
log. A WS publish is an AMQP 1.0 message to rstream; rstream's records (raw JSON, AMQP with JSON data)
arrive over WS in the offset/previousOffset chain; a pkey chooses the partition a Java/Go/.NET/JS super
stream producer's murmur3 routing chooses for the same key."""

import asyncio
import json

import aiohttp
import pytest
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer, amqp_decoder
from rstream import SuperStreamCreationOption, SuperStreamProducer
from rstream._pyamqp.message import Properties

from procs import ServerProcess
from riverbed.engine import record as rec
from riverbed.shells.ws_json import partition_for_key

pytestmark = pytest.mark.integration
CREDS = dict(username="guest", password="guest")


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("wsx") / "data", "--ws-port", "0").start()
    yield srv
    assert srv.stop() == 0, srv.log()


async def ws_connect(s, srv):
    return await s.ws_connect(f"http://127.0.0.1:{srv.ports['ws']}/api/v1/ws")


async def recv(ws, timeout=5):
    return json.loads((await ws.receive(timeout=timeout)).data)


async def consume(port, stream, n, decoder=None, timeout=10):
    got, done = [], asyncio.Event()

    async def on_message(msg, ctx):
        got.append((ctx.offset, msg))
        if len(got) >= n:
            done.set()
    async with Consumer("127.0.0.1", port, **CREDS) as c:
        await c.start()
        await c.subscribe(stream, on_message, decoder=decoder,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
        await asyncio.wait_for(done.wait(), timeout)
    return got


def test_ws_publish_read_by_rstream_as_amqp(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await ws_connect(s, server)
            await ws.send_str(json.dumps({"type": "publish", "stream": "x-ws", "msg": '{"temp": 21.5}',
                                          "ts": 1533924184016, "pkey": "dev-7"}))
            await ws.send_str(json.dumps({"type": "publish", "stream": "x-ws", "msg": "[1, 2]"}))
            await ws.send_str(json.dumps({"type": "subscribe", "stream": "x-ws"}))
            assert (await recv(ws))[1] == 2          # both publishes were taken before the subscribe answer
        got = await consume(server.port, "x-ws", 2, decoder=amqp_decoder)
        (o1, m1), (o2, m2) = got
        assert (o1, o2) == (0, 1)
        assert m1.properties.content_type in (b"application/json", "application/json")
        assert m1.properties.creation_time == 1533924184016
        assert {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in m1.application_properties.items()} == {"pkey": "dev-7"}
        assert b"".join(m1.body if isinstance(m1.body, list) else [m1.body]) == b'{"temp": 21.5}'
        assert m2.properties.creation_time > 1533924184016
        assert not m2.application_properties
    run(go())


def test_rstream_records_arrive_over_ws(server):
    async def go():
        async with aiohttp.ClientSession() as s:
            ws = await ws_connect(s, server)
            await ws.send_str(json.dumps({"type": "subscribe", "stream": "x-rs"}))    # waits for it
            assert (await recv(ws))[1] == 2
            async with Producer("127.0.0.1", server.port, **CREDS) as p:
                await p.create_stream("x-rs")
                await p.send_wait("x-rs", b'{"raw": 1}')
                await p.send_wait("x-rs", AMQPMessage(body=b'{"amqp": 2}',
                                                      properties=Properties(content_type=b"application/json",
                                                                            creation_time=1600000000000)))
                await p.send_wait("x-rs", b"\x00\x01 not json")
            await ws.send_str(json.dumps({"type": "publish", "stream": "x-rs", "msg": '{"ws": 4}', "ts": 5}))
            frames = [await recv(ws) for _ in range(4)]
            msgs = [f[3] for f in frames]
            assert [f[:3] for f in frames] == [[0, 0, ""]] * 4
            assert [m[8] for m in msgs] == ['{"raw": 1}', '{"amqp": 2}', '{"base64":"AAEgbm90IGpzb24="}', '{"ws": 4}']
            assert [m[5] for m in msgs] == [0, 1, 2, 3] and [m[6] for m in msgs] == [None, 0, 1, 2]
            assert msgs[1][3] == 1600000000000 and msgs[3][3] == 5
            assert all(m[7] == 27 for m in msgs)
    run(go())


def test_pkey_routes_like_the_murmur3_super_stream_clients(server):
    """A WS publish with pkey k lands in partition murmur3_x86_32(UTF-8 k, seed 104729) % n, the partition
    the Java/Go/.NET/JS clients' super stream producers pick for routing key k (tests/shells/test_ws_codec.py
    checks the hash against a reference implementation). rstream 1.1.1 hashes UTF-16 with the 128-bit
    variant, so its hash routing is not followed; a producer that routes the murmur3 way is emulated by
    publishing with rstream to the partition stream that routing names."""
    keys = [f"device-{i}" for i in range(12)]

    async def go():
        async with SuperStreamProducer("127.0.0.1", server.port, **CREDS, super_stream="x-orders",
                                       super_stream_creation_option=SuperStreamCreationOption(n_partitions=3),
                                       routing_extractor=lambda m: "k") as ssp:
            assert ssp is not None
        parts = ["x-orders-0", "x-orders-1", "x-orders-2"]
        async with aiohttp.ClientSession() as s:
            ws = await ws_connect(s, server)
            for p in range(3):
                await ws.send_str(json.dumps({"type": "subscribe", "stream": "x-orders", "partition": p}))
                assert await recv(ws) == [0, 2, "", {"stream": "x-orders", "partition": p}]
            async with Producer("127.0.0.1", server.port, **CREDS) as prod:
                for k in keys:
                    await ws.send_str(json.dumps({"type": "publish", "stream": "x-orders", "pkey": k,
                                                  "msg": json.dumps({"from": "ws", "k": k})}))
                    f = await recv(ws)
                    assert f[3][2] == partition_for_key(k, 3)
                    await prod.send_wait(parts[partition_for_key(k, 3)], json.dumps({"from": "rs", "k": k}).encode())
                    g = await recv(ws)
                    assert g[3][2] == f[3][2] and g[3][6] == f[3][5]     # same partition, next in its chain
            assert len({partition_for_key(k, 3) for k in keys}) == 3
        for p, name in enumerate(parts):
            mine = [k for k in keys if partition_for_key(k, 3) == p]
            got = await consume(server.port, name, 2 * len(mine))
            msgs = [json.loads(rec.decode_record(bytes(m)).payload) for _, m in got]
            assert [m["k"] for m in msgs if m["from"] == "ws"] == mine
            assert [m["k"] for m in msgs if m["from"] == "rs"] == mine
    run(go())

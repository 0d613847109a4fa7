"""The BSON/TCP (mewbase) shell against ``riverbed serve``: through the project's client
(riverbed.shells.bson_tcp.client) and through raw sockets, one server for the module."""

import asyncio
import json
import socket
import struct
import time

import bson
import pytest
from bson.int64 import Int64

from bsonwire import RawBson as Raw
from procs import ServerProcess
from riverbed.shells.bson_tcp.client import BsonClient, BsonError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("bson") / "data", "--bson-port", "0").start()
    yield s
    code = s.stop()
    assert code == 0, s.log()


@pytest.fixture
def port(srv):
    return srv.ports["bson"]


def run(coro, timeout=120):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


_n = [0]


def fresh(prefix="ch"):
    _n[0] += 1
    return f"{prefix}-{_n[0]}-{time.monotonic_ns()}"


# ------------------------------------------------------------------------------------- raw sockets

# --------------------------------------------------------------------------------------- CONNECT

def test_connect_version_and_before_connect(port):
    r = Raw(port, connect=False)
    r.send("CONNECT", {"version": "0.2"})
    f = r.recv()["frame"]
    assert f["ok"] is False and f["errCode"] == 100 and "rID" not in f
    assert r.closed()
    r = Raw(port, connect=False)
    r.send("CONNECT", {"version": 0.05, "username": "x", "password": "y"})   # credentials ignored w/o --users
    assert r.recv()["frame"] == {"ok": True}
    r.close()
    r = Raw(port, connect=False)
    r.send("PUB", {"channel": "x", "event": {"a": 1}, "rID": 7})
    f = r.recv()["frame"]
    assert f == {"ok": False, "rID": 7, "errCode": 2, "errMsg": f["errMsg"]}
    assert r.closed()


# ---------------------------------------------------------------------------------- PUB, RECEV

def test_publish_subscribe_roundtrip_and_pipelining(port):
    ch = fresh()

    async def main():
        async with await BsonClient.connect(port=port) as cl:
            r = await cl.publish(ch, {"n": 0, "nested": {"a": [1, 2]}})
            assert r["ok"] is True and isinstance(r["rID"], int)
            acks = [cl.publish_nowait(ch, {"n": i}) for i in range(1, 2001)]
            rs = await asyncio.gather(*acks)
            assert len({x["rID"] for x in rs}) == 2000
            sub = await cl.subscribe(ch, start_pos=0)
            evs = [await sub.get(10) for _ in range(2001)]
            assert [e.pos for e in evs] == list(range(2001))
            assert [e.event["n"] for e in evs] == list(range(2001))
            assert evs[0].event == {"n": 0, "nested": {"a": [1, 2]}}
            assert all(isinstance(e.timestamp, int) and e.timestamp > 1.7e12 for e in evs)
            # new events arrive live
            await cl.publish(ch, {"n": "live"})
            e = await sub.get(10)
            assert e.pos == 2001 and e.event == {"n": "live"}
            await sub.close()
    run(main())


def test_subscribe_start_fields(port):
    ch = fresh()

    async def main():
        async with await BsonClient.connect(port=port) as cl:
            for i in range(5):
                await cl.publish(ch, {"i": i})
            await asyncio.sleep(0.05)
            t_mid = int(time.time() * 1000)
            await asyncio.sleep(0.05)
            for i in range(5, 8):
                await cl.publish(ch, {"i": i})
            s = await cl.subscribe(ch, start_pos=3)
            assert [(await s.get(5)).pos for _ in range(5)] == [3, 4, 5, 6, 7]
            s = await cl.subscribe(ch, start_timestamp=t_mid)
            assert [(await s.get(5)).event["i"] for _ in range(3)] == [5, 6, 7]
            s_new = await cl.subscribe(ch)           # neither: only events after the SUBRESPONSE
            await cl.publish(ch, {"i": 8})
            e = await s_new.get(5)
            assert e.event == {"i": 8} and e.pos == 8
            with pytest.raises(asyncio.TimeoutError):
                await s_new.get(0.3)
            with pytest.raises(BsonError) as ei:
                await cl.subscribe(ch, start_pos=0, start_timestamp=1)
            assert ei.value.code == 6
            with pytest.raises(BsonError) as ei:
                await cl.subscribe(fresh("missing"), start_pos=0)
            assert ei.value.code == 3
    run(main())


def test_both_start_fields_sends_no_recev(port):
    ch = fresh()
    r = Raw(port)
    r.send("PUB", {"channel": ch, "event": {"a": 1}, "rID": 1})
    assert r.recv()["frame"]["ok"]
    r.send("SUBSCRIBE", {"channel": ch, "rID": 2, "startPos": Int64(0), "startTimestamp": Int64(0)})
    f = r.recv()
    assert f["type"] == "SUBRESPONSE" and f["frame"]["ok"] is False and f["frame"]["rID"] == 2
    r.quiet()
    r.close()


MATCHER_EVENTS = [
    {"k": 1, "s": "apple", "d": {"x": 1}, "t": ["a"]},
    {"k": 2, "s": "banana", "d": {"x": 2}},
    {"k": 3, "s": "cherry", "d": {"x": 1, "y": 2}, "opt": None},
    {"k": 4.0, "s": "apricot"},
    {"k": "5", "s": "date", "d": {"x": 3}},
]


@pytest.mark.parametrize("matcher,expect", [
    ({"k": 2}, [2]),
    ({"d": {"x": 1}}, [1]),                        # whole embedded document equality
    ({"d.x": 1}, [1, 3]),
    ({"k": {"$gt": 1, "$lte": 4}}, [2, 3, 4]),     # several operators on one field
    ({"k": {"$gte": 3}}, [3, 4]),
    ({"k": {"$lt": 2}}, [1]),
    ({"k": {"$ne": 2}}, [1, 3, 4, 5]),
    ({"d.x": {"$ne": 1}}, [2, 4, 5]),              # $ne matches a missing field
    ({"k": {"$in": [1, 4]}}, [1, 4]),
    ({"d.x": {"$nin": [1, 2]}}, [4, 5]),           # $nin matches a missing field
    ({"opt": {"$exists": True}}, [3]),
    ({"d": {"$exists": False}}, [4]),
    ({"s": {"$regex": "^a"}}, [1, 4]),
    ({"$or": [{"k": 1}, {"s": "date"}]}, [1, 5]),
    ({"$and": [{"d.x": {"$gte": 1}}, {"s": {"$regex": "an"}}]}, [2]),
])
def test_subscribe_matcher(port, matcher, expect):
    ch = fresh()

    async def main():
        async with await BsonClient.connect(port=port) as cl:
            for i, e in enumerate(MATCHER_EVENTS):
                await cl.publish(ch, dict(e, i=i + 1))
            await cl.publish(ch, {"end": True, "k": 1000, "s": "zzz", "d": {"x": 1000}, "i": 99})
            m = {"$or": [matcher, {"end": True}]}
            sub = await cl.subscribe(ch, start_pos=0, matcher=m)
            got = []
            while True:
                e = await sub.get(5)
                if e.event.get("end"):
                    break
                got.append(e.event["i"])
            assert got == expect
    run(main())


def test_bad_matcher_refused(port):
    ch = fresh()

    async def main():
        async with await BsonClient.connect(port=port) as cl:
            await cl.create_channel(ch)
            with pytest.raises(BsonError) as ei:
                await cl.subscribe(ch, start_pos=0, matcher={"a": {"$where": "1"}})
            assert ei.value.code == 6
            assert await cl.list_channels()           # the connection still works
    run(main())


# ------------------------------------------------------------------------------------ flow control

def test_window_stops_near_4_mib_and_resumes(port):
    ch = fresh()
    payload = "x" * 10_000          # ~10 KiB events: 8 MiB = ~820 of them

    async def main():
        async with await BsonClient.connect(port=port) as cl:
            n = 820
            await asyncio.gather(*[cl.publish_nowait(ch, {"i": i, "p": payload}) for i in range(n)])
    run(main())
    r = Raw(port)
    r.send("SUBSCRIBE", {"channel": ch, "rID": 1, "startPos": Int64(0)})
    assert r.recv()["frame"]["ok"]
    got, nbytes = [], 0
    while True:
        try:
            f, size = r.recv_raw_len(timeout=1.0)
        except socket.timeout:
            break
        got.append(f["frame"]["pos"])
        nbytes += size
    assert 4 << 20 < nbytes < (4 << 20) + 20_000, nbytes      # paused just above 4 MiB
    assert got == list(range(len(got)))
    # ACK less than needed to go below 2 MiB: nothing more
    r.send("ACKEV", {"subID": 0, "bytes": 1 << 20, "pos": Int64(got[-1])})
    with pytest.raises(socket.timeout):
        r.recv(0.5)
    # ACK the rest: it resumes and delivers everything, nothing lost or doubled
    r.send("ACKEV", {"subID": 0, "bytes": nbytes - (1 << 20), "pos": Int64(got[-1])})
    while len(got) < 820:
        f, size = r.recv_raw_len(timeout=5)
        got.append(f["frame"]["pos"])
        if len(got) % 100 == 0:
            r.send("ACKEV", {"subID": 0, "bytes": 1 << 22, "pos": Int64(got[-1])})
    assert got == list(range(820))
    r.close()

    async def client_reads_all():
        # the client's automatic ACKEVs keep the 8 MiB flowing past the window
        async with await BsonClient.connect(port=port) as cl:
            sub = await cl.subscribe(ch, start_pos=0)
            return [(await sub.get(10)).pos for _ in range(820)]
    assert run(client_reads_all()) == list(range(820))


# ---------------------------------------------------------------------------- durable subscriptions

def test_durable_subscription_resumes_after_subclose_and_unsubscribe_deletes(port):
    ch = fresh()
    did = fresh("durable")

    async def main():
        async with await BsonClient.connect(port=port) as cl:
            for i in range(10):
                await cl.publish(ch, {"i": i})
            sub = await cl.subscribe(ch, start_pos=0, durable_id=did, auto_ack=False)
            evs = [await sub.get(5) for _ in range(6)]
            sub.ack(sum(e.size for e in evs), evs[-1].pos)      # acknowledged up to pos 5
            await sub.close()                                    # answered after the ACKEV is stored
            sub = await cl.subscribe(ch, start_pos=0, durable_id=did)
            e = await sub.get(5)
            assert e.pos in (5, 6)                               # resumes after 5 (may repeat exactly 5)
            assert e.pos == 6
            await sub.unsubscribe()
            sub = await cl.subscribe(ch, durable_id=did)          # state gone: start fields (new only)
            await cl.publish(ch, {"i": 10})
            assert (await sub.get(5)).pos == 10
    run(main())


# --------------------------------------------------------------------------------- transactions

def test_transaction_interleaved_with_other_connection(port):
    ch = fresh()

    async def main():
        async with await BsonClient.connect(port=port) as a, await BsonClient.connect(port=port) as b:
            await b.create_channel(ch)
            watcher = await b.subscribe(ch, start_pos=0)
            await a.start_tx(1)
            with pytest.raises(BsonError):
                await a.start_tx(1)                               # twice = ok:false
            for i in range(5):
                r = await a.publish(ch, {"tx": i}, sess_id=1)      # answered at once
                assert r["ok"]
                await b.publish(ch, {"b": i})
            # the other connection's events are there, the transaction's are not
            seen = [await watcher.get(5) for _ in range(5)]
            assert [e.event for e in seen] == [{"b": i} for i in range(5)]
            with pytest.raises(asyncio.TimeoutError):
                await watcher.get(0.3)
            await a.commit_tx(1)
            seen = [await watcher.get(5) for _ in range(5)]
            assert [e.event for e in seen] == [{"tx": i} for i in range(5)]
            assert [e.pos for e in seen] == list(range(5, 10))     # contiguous, in PUB order
            with pytest.raises(BsonError):
                await a.commit_tx(1)                              # none open
            with pytest.raises(BsonError):
                await a.abort_tx(1)
            # abort discards
            await a.start_tx(2)
            await a.publish(ch, {"aborted": 1}, sess_id=2)
            await a.abort_tx(2)
            # a transaction over two channels commits in one engine transaction
            ch2 = fresh()
            async with a.transaction() as tx:
                await tx.publish(ch, {"multi": 1})
                await tx.publish(ch2, {"multi": 2})
            assert (await watcher.get(5)).event == {"multi": 1}
            s2 = await b.subscribe(ch2, start_pos=0)
            assert (await s2.get(5)).event == {"multi": 2}
            with pytest.raises(asyncio.TimeoutError):
                await watcher.get(0.3)
    run(main())


def test_closed_connection_discards_open_transaction(port):
    ch = fresh()

    async def main():
        a = await BsonClient.connect(port=port)
        await a.start_tx(9)
        await a.publish(ch, {"lost": 1}, sess_id=9)
        await a.close()
        async with await BsonClient.connect(port=port) as b:
            await b.publish(ch, {"kept": 1})
            s = await b.subscribe(ch, start_pos=0)
            assert (await s.get(5)).event == {"kept": 1}
            with pytest.raises(asyncio.TimeoutError):
                await s.get(0.3)
    run(main())


# ------------------------------------------------------------------- binders, projections, queries

def test_channels_and_binders_admin(port):
    ch, bd = fresh(), fresh("binder")

    async def main():
        async with await BsonClient.connect(port=port) as cl:
            assert await cl.create_channel(ch) is False
            assert await cl.create_channel(ch) is True
            assert ch in await cl.list_channels()
            assert await cl.create_binder(bd) is False
            assert await cl.create_binder(bd) is True
            binders = await cl.list_binders()
            assert bd in binders and not any(b.startswith("_riverbed") for b in binders)
    run(main())
    r = Raw(port)
    r.send("LISTCHANNNELS", {"rID": 5})                          # the real server's spelling
    f = r.recv()["frame"]
    assert f["ok"] and f["rID"] == 5 and ch in f["channels"]
    r.close()


def test_projection_covers_earlier_events_merge_and_replace(port):
    ch = fresh()
    merged, replaced = fresh("merged"), fresh("replaced")

    async def main():
        async with await BsonClient.connect(port=port) as cl:
            await asyncio.gather(*[cl.publish_nowait(ch, {"user": {"id": i % 100}, "seq": i, "kind": "a" if i % 2 else "b"})
                                   for i in range(1000)])
            await cl.create_projection("m-" + merged, channel=ch, binder=merged, doc_id="user.id")
            await cl.create_projection("r-" + replaced, channel=ch, binder=replaced, doc_id="seq",
                                       matcher={"kind": "a"}, mode="replace")
            # the same definition again is fine; another under the same name is refused
            await cl.create_projection("m-" + merged, channel=ch, binder=merged, doc_id="user.id")
            with pytest.raises(BsonError):
                await cl.create_projection("m-" + merged, channel=ch, binder=merged, doc_id="seq")
            await cl.publish(ch, {"user": {"id": 7}, "extra": "late", "seq": 1000, "kind": "b"})
            for _ in range(100):
                d = await cl.find_by_id(merged, 7)
                if d and d.get("extra") == "late":
                    break
                await asyncio.sleep(0.05)
            assert d == {"user": {"id": 7}, "seq": 1000, "kind": "b", "extra": "late"}   # no _id added
            for _ in range(100):
                docs = [x async for x in cl.query(replaced)]
                if len(docs) == 500:
                    break
                await asyncio.sleep(0.05)
            assert sorted(x["seq"] for x in docs) == list(range(1, 1000, 2))
            assert await cl.find_by_id(replaced, 3) == {"user": {"id": 3}, "seq": 3, "kind": "a"}
            assert await cl.find_by_id(replaced, 2) is None
            assert len([x async for x in cl.query(merged)]) == 100
    run(main())


def test_query_800_docs_of_10_kib_under_queryack(port):
    ch, bd = fresh(), fresh("big")
    pad = "y" * 10_240

    async def main():
        async with await BsonClient.connect(port=port) as cl:
            await asyncio.gather(*[cl.publish_nowait(ch, {"id": i, "pad": pad, "even": i % 2 == 0}) for i in range(800)])
            await cl.create_projection("p-" + bd, channel=ch, binder=bd, doc_id="id", mode="replace")
            for _ in range(200):
                if len([x async for x in cl.query(bd, {"id": {"$gte": 799}})]) == 1:
                    break
                await asyncio.sleep(0.05)
            docs = [x async for x in cl.query(bd, {"even": True})]
            assert sorted(d["id"] for d in docs) == list(range(0, 800, 2))
    run(main())
    # raw: without QUERYACK the server stops just above 4 MiB, and resumes on QUERYACK
    r = Raw(port)
    r.send("QUERY", {"queryID": 1, "binder": bd, "matcher": {}})
    n, nbytes, last = 0, 0, False
    while True:
        try:
            f, size = r.recv_raw_len(timeout=1.0)
        except socket.timeout:
            break
        assert f["type"] == "QUERYRESULT" and f["frame"]["queryID"] == 1
        n, nbytes, last = n + 1, nbytes + size, f["frame"]["last"]
    assert 4 << 20 < nbytes < (4 << 20) + 20_000 and not last
    while not last:
        r.send("QUERYACK", {"queryID": 1, "bytes": nbytes})
        nbytes = 0
        while True:
            try:
                f, size = r.recv_raw_len(timeout=1.0)
            except socket.timeout:
                break
            n, nbytes, last = n + 1, nbytes + size, f["frame"]["last"]
            if last:
                break
    assert n == 800
    # docID, a missing docID, an unknown binder, several queries in flight
    r.send("QUERY", {"queryID": 2, "binder": bd, "docID": 5})
    r.send("QUERY", {"queryID": 3, "binder": bd, "docID": 100000})
    r.send("QUERY", {"queryID": 4, "binder": fresh("nobinder"), "matcher": {}})
    got = {}
    for _ in range(3):
        f = r.recv()["frame"]
        got[f["queryID"]] = f
    assert got[2]["last"] is True and got[2]["result"]["id"] == 5
    assert got[3] == {"queryID": 3, "last": True}
    assert got[4]["ok"] is False and got[4]["errCode"] == 4 and got[4]["last"] is True
    r.send("FINDBYID", {"rID": 9, "binder": bd, "dodID": 6})      # the real server's field name
    f = r.recv()["frame"]
    assert f["ok"] and f["rID"] == 9 and f["doc"]["id"] == 6
    r.send("FINDBYID", {"rID": 10, "binder": bd, "docID": 123456})
    assert r.recv()["frame"] == {"ok": True, "rID": 10}
    r.close()


# ------------------------------------------------------------------------------ PING, errors

def test_ping_and_unknown_type(port):
    r = Raw(port)
    r.send("PING", {"type": 8, "sequence": 41})
    assert r.recv() == {"type": "PING", "frame": {"type": 0, "sequence": 42}}
    r.send("FROBNICATE", {"rID": 3})
    assert r.recv()["frame"] == {"ok": False, "rID": 3, "errCode": 6, "errMsg": "unknown frame type 'FROBNICATE'"}
    r.send("LISTCHANNELS", {"rID": 4})                           # still open
    assert r.recv()["frame"]["rID"] == 4
    r.close()


def test_bad_input_closes_only_that_connection(srv, port):
    good = Raw(port)
    anon0 = None
    for round_ in range(40):
        if round_ == 10:          # after a warm-up, the heap must stay flat
            anon0 = srv.anon_kb()
        # a 100 MB declared length: refused at once, nothing read or allocated
        r = Raw(port)
        r.sendraw(struct.pack("<i", 100_000_000) + b"\x00" * 16)
        f = r.recv()["frame"]
        assert f["ok"] is False and f["errCode"] == 6
        assert r.closed()
        # invalid BSON
        r = Raw(port)
        r.sendraw(struct.pack("<i", 12) + b"\x7fabc\x00\x00\x00\x00")
        assert r.recv()["frame"]["ok"] is False and r.closed()
        # a document without the envelope
        r = Raw(port)
        r.sendraw(bson.encode({"hello": "world"}))
        assert r.recv()["frame"]["ok"] is False and r.closed()
        # a declared length below 5
        r = Raw(port)
        r.sendraw(struct.pack("<i", 2))
        assert r.recv()["frame"]["ok"] is False and r.closed()
        # invalid BSON inside a PUB's event: refused, nothing stored, connection stays
        r = Raw(port)
        bad_event = bson.encode({"type": "PUB", "frame": {"channel": "bad-input", "rID": 1, "event": {"a": 1}}})
        i = bad_event.index(b"\x10a\x00")
        bad_event = bad_event[:i] + b"\x99" + bad_event[i + 1:]
        r.sendraw(bad_event)
        f = r.recv()["frame"]
        assert f["ok"] is False
        r.close()
    good.send("LISTCHANNELS", {"rID": 1})
    f = good.recv()["frame"]
    assert f["ok"] is True and "bad-input" not in f["channels"]
    assert srv.anon_kb() - anon0 < 4_000, (anon0, srv.anon_kb())
    good.close()


# ------------------------------------------------------------------------------ cross-protocol

def test_cross_protocol_with_rstream(srv, port):
    from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, OffsetType, Producer
    ch = fresh()

    async def main():
        async with await BsonClient.connect(port=port) as cl:
            await cl.publish(ch, {"from": "bson", "n": 1})
            got = []
            done = asyncio.Event()

            async def on_message(msg, ctx):
                got.append(msg)
                done.set()
            consumer = Consumer("127.0.0.1", srv.port, username="guest", password="guest")
            await consumer.start()
            await consumer.subscribe(ch, on_message, decoder=None,
                                     offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            await asyncio.wait_for(done.wait(), 10)
            await consumer.close()
            from riverbed.engine.record import decode_record
            rec = decode_record(bytes(got[0]))
            assert rec.amqp and rec.content_type == "application/bson"
            assert bson.decode(rec.payload) == {"from": "bson", "n": 1}
            assert isinstance(rec.creation_time, int)
            # an rstream publish of JSON (and of raw bytes) arrives as a document
            async with Producer("127.0.0.1", srv.port, username="guest", password="guest") as p:
                await p.send_wait(ch, json.dumps({"from": "rstream", "n": 2}).encode())
                await p.send_wait(ch, AMQPMessage(body=b"\x00\x01binary"))
            sub = await cl.subscribe(ch, start_pos=0)
            evs = [await sub.get(5) for _ in range(3)]
            assert evs[0].event == {"from": "bson", "n": 1}
            assert evs[1].event == {"from": "rstream", "n": 2}
            assert evs[2].event == {"data": b"\x00\x01binary"}
    run(main())

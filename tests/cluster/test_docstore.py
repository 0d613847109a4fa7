"""The document store and transactions on three real nodes joined through a real etcd (issue 25):
document writes through the replicated changelog (shells/cluster/docs.py), read on every node, kept
through a kill -9, unique keys decided once; BSON transactions acknowledged only once a majority holds
them, and kept whole through a failover."""

import asyncio
import json
import os
import signal
import socket
import sys
import time

import pytest

from clusterfixtures import running_cluster

from riverbed.shells.bson_tcp.client import BsonClient, BsonError

pytestmark = pytest.mark.integration

CHANGELOG = "__riverbed_docs"
LISTENERS = ("--ream-port", "0", "--bson-port", "0")


class Ream:
    """A raw REAM client: ``request(bytes)`` -> (reply line, payload or None)."""

    def __init__(self, port, timeout=10):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = bytearray()
        self.line()                       # the banner

    def close(self):
        self.sock.close()

    def line(self):
        while b"\n" not in self.buf:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("connection closed")
            self.buf += data
        i = self.buf.index(b"\n")
        out = bytes(self.buf[:i]).decode()
        del self.buf[:i + 1]
        return out

    def msg(self):
        line = self.line()
        w = line.split(" ")
        if (w[:2] == ["AGGREGATE", "GOT"] and len(w) == 5) or (w[:2] == ["PROJECTION", "SELECTED"] and len(w) == 4):
            n = int(w[-1])
            while len(self.buf) < n + 1:
                self.buf += self.sock.recv(1 << 20)
            payload = bytes(self.buf[:n])
            del self.buf[:n + 1]
            return line, payload
        return line, None

    def request(self, data):
        self.sock.sendall(data)
        return self.msg()


def sized(head, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    return head.encode() + b" %d\n" % len(payload) + payload + b"\n"


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def eventually(fn, timeout=10.0, what="the documents"):
    """``fn()`` until it returns a true value (which is returned), else fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except (OSError, EOFError, BsonError, asyncio.TimeoutError) as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {last!r}")


def stream_of(st, name):
    return next((s for s in st["streams"] if s["name"] == name), None)


def leader_of(c, name, not_this=None):
    st = c.wait(lambda st: stream_of(st, name) is not None and stream_of(st, name)["leader"] not in ("", not_this)
                and stream_of(st, name)["leader"] in [n["name"] for n in st["nodes"] if n["up"]],
                what=f"a leader of {name}")
    return stream_of(st, name)["leader"]


@pytest.fixture
def docs3(tmp_path, etcd):
    with running_cluster(tmp_path, etcd, extra=LISTENERS) as c:
        yield c


def ream(c, node):
    return Ream(c.nodes[node].ports["ream"])


def agg_get(c, node, name, doc_id):
    r = ream(c, node)
    try:
        line, payload = r.request(f"AGGREGATE GET {name} {doc_id}\n".encode())
        return json.loads(payload) if line.startswith("AGGREGATE GOT") else None
    finally:
        r.close()


def select(c, node, name, where="TRUE"):
    r = ream(c, node)
    try:
        line, payload = r.request(sized(f"PROJECTION SELECT {name}", where))
        return sorted(json.loads(payload), key=lambda row: row["name"]) if payload is not None else None
    finally:
        r.close()


async def bson_find(port, binder, doc_id):
    async with await BsonClient.connect("127.0.0.1", port) as cl:
        return await cl.find_by_id(binder, doc_id)


async def bson_query(port, binder, matcher):
    async with await BsonClient.connect("127.0.0.1", port) as cl:
        return [d async for d in cl.query(binder, matcher)]


def test_documents_written_through_one_node_are_read_on_the_others_and_survive_its_kill(docs3):
    c = docs3
    w = ream(c, "n1")
    # the first document write makes the changelog; the node it reached leads it
    assert w.request(sized("AGGREGATE SET carts 12", '{"items":3}'))[0] == "AGGREGATE SET DONE carts 12"
    assert leader_of(c, CHANGELOG) == "n1"
    assert w.request(b"PROJECTION CREATE people 3 +name +email *city\n")[0] == "PROJECTION CREATED people"
    peter = {"name": "peter", "email": "p@x", "city": "Oslo"}
    assert w.request(sized("PROJECTION SET people", json.dumps(peter)))[0] == 'PROJECTION SET DONE people "peter"'
    # read your own write on the writer's node at once
    assert agg_get(c, "n1", "carts", 12) == {"items": 3}
    # a stream projection (mewbase CREATEPROJECTION) runs on the changelog's leader and writes through it
    async def project(port):
        async with await BsonClient.connect("127.0.0.1", port) as cl:
            await cl.create_projection("by_id", channel="orders", binder="orders_view", doc_id="id", mode="replace")
            for i in range(5):
                await cl.publish("orders", {"id": i, "total": i * 10})
    run(project(c.nodes["n1"].ports["bson"]))
    for node in ("n2", "n3"):
        assert eventually(lambda: agg_get(c, node, "carts", 12) == {"items": 3})
        assert eventually(lambda: select(c, node, "people") == [peter])
        assert eventually(lambda: select(c, node, "people", 'city = "Oslo"') == [peter])
        port = c.nodes[node].ports["bson"]
        # an aggregate is a binder of the same name (one document namespace), on every node
        assert eventually(lambda: run(bson_find(port, "carts", 12)) == {"items": 3})
        assert eventually(lambda: run(bson_find(port, "orders_view", 4)) == {"id": 4, "total": 40})
        assert eventually(lambda: len(run(bson_query(port, "orders_view", {"total": {"$gte": 20}}))) == 3)

    # acknowledged, then kill -9 at once (before the others may even have heard it committed): it survives
    tom = {"name": "tom", "email": "t@x", "city": "Rome"}
    assert w.request(sized("PROJECTION SET people", json.dumps(tom)))[0] == 'PROJECTION SET DONE people "tom"'
    assert w.request(sized("AGGREGATE SET carts 13", '{"items":7}'))[0] == "AGGREGATE SET DONE carts 13"
    c.nodes["n1"].kill()
    w.close()
    new = leader_of(c, CHANGELOG, not_this="n1")
    other = "n3" if new == "n2" else "n2"
    for node in (new, other):
        assert eventually(lambda: select(c, node, "people") == [peter, tom])
        assert eventually(lambda: agg_get(c, node, "carts", 13) == {"items": 7})
    # the new leader takes writes, and the other survivor reads them; the projection goes on there
    r = ream(c, new)
    assert r.request(sized("AGGREGATE SET carts 14", '{"items":1}'))[0] == "AGGREGATE SET DONE carts 14"
    r.close()
    assert eventually(lambda: agg_get(c, other, "carts", 14) == {"items": 1})
    leader_of(c, "orders", not_this="n1")

    async def more(port):
        async with await BsonClient.connect("127.0.0.1", port) as cl:
            await cl.publish("orders", {"id": 9, "total": 90})
    orders_leader = leader_of(c, "orders", not_this="n1")
    run(more(c.nodes[orders_leader].ports["bson"]))
    assert eventually(lambda: run(bson_find(c.nodes[other].ports["bson"], "orders_view", 9)) == {"id": 9, "total": 90})


def test_two_nodes_racing_one_unique_key_exactly_one_wins_everywhere(docs3):
    c = docs3
    w = ream(c, "n1")
    assert w.request(b"PROJECTION CREATE users 2 +name +email\n")[0] == "PROJECTION CREATED users"
    leader = leader_of(c, CHANGELOG)
    assert leader == "n1"
    for node in ("n2", "n3"):
        eventually(lambda: select(c, node, "users") == [])
    a, b = ream(c, "n1"), ream(c, "n2")
    try:
        rows = {"ann": {"name": "ann", "email": "same@x"}, "bob": {"name": "bob", "email": "same@x"}}
        # both requests leave before either answer comes back
        a.sock.sendall(sized("PROJECTION SET users", json.dumps(rows["ann"])))
        b.sock.sendall(sized("PROJECTION SET users", json.dumps(rows["bob"])))
        answers = {"ann": a.msg()[0], "bob": b.msg()[0]}
    finally:
        a.close()
        b.close()
    won = [n for n, line in answers.items() if line == f'PROJECTION SET DONE users "{n}"']
    assert len(won) == 1, answers
    lost = "bob" if won == ["ann"] else "ann"
    assert answers[lost].startswith('PROJECTION NON SET users "Unique constraint violated'), answers
    for node in ("n1", "n2", "n3"):
        assert eventually(lambda: select(c, node, "users") == [rows[won[0]]])

    # a write through a node that does not lead the changelog: its record is forwarded to the leader,
    # and the write is answered once this node has applied it (read your writes, at once)
    r = ream(c, "n3")
    try:
        assert r.request(sized("AGGREGATE SET carts 5", '{"via":"n3"}'))[0] == "AGGREGATE SET DONE carts 5"
        line, payload = r.request(b"AGGREGATE GET carts 5\n")
        assert line.startswith("AGGREGATE GOT carts 5") and json.loads(payload) == {"via": "n3"}
    finally:
        r.close()
    assert eventually(lambda: agg_get(c, "n1", "carts", 5) == {"via": "n3"})

    # mewbase: two CREATEPROJECTIONs of one name with different definitions, through two nodes
    async def channel(port):
        async with await BsonClient.connect("127.0.0.1", port) as cl:
            await cl.create_channel("clicks")
    run(channel(c.nodes["n1"].ports["bson"]))
    leader_of(c, "clicks")
    c.wait(lambda st: all(m["lag"] == 0 for m in stream_of(st, "clicks")["members"]), what="clicks' members")
    time.sleep(0.5)        # every node has read the placement (its refresh polls every 0.25 s)

    async def create(port, binder):
        async with await BsonClient.connect("127.0.0.1", port) as cl:
            try:
                await cl.create_projection("p1", channel="clicks", binder=binder, doc_id="id")
                return None
            except BsonError as e:
                return e.code

    async def race():
        return await asyncio.gather(create(c.nodes["n1"].ports["bson"], "view_a"),
                                    create(c.nodes["n3"].ports["bson"], "view_b"))
    codes = run(race())
    assert sorted(codes, key=str) == [6, None], codes

    # a projection defined through a node that does not lead the changelog runs on the one that does
    async def define_and_publish():
        async with await BsonClient.connect("127.0.0.1", c.nodes["n2"].ports["bson"]) as cl:
            await cl.create_projection("p2", channel="clicks", binder="view_c", doc_id="id", mode="replace")
        async with await BsonClient.connect("127.0.0.1", c.nodes["n1"].ports["bson"]) as cl:
            await cl.publish("clicks", {"id": 1, "at": "home"})
    run(define_and_publish())
    for node in ("n1", "n2", "n3"):
        port = c.nodes[node].ports["bson"]
        assert eventually(lambda: run(bson_find(port, "view_c", 1)) == {"id": 1, "at": "home"})


def committx(port, channels, n, sess_id=7):
    """A coroutine function: connect, STARTTX, ``n`` PUBs to each of ``channels``; returns the client."""
    async def go():
        cl = await BsonClient.connect("127.0.0.1", port)
        await cl.start_tx(sess_id)
        await asyncio.gather(*[cl.publish_nowait(ch, {"ch": ch, "i": i}, sess_id=sess_id)
                               for ch in channels for i in range(n)])
        return cl
    return go


async def read_all(port, channel, timeout=3.0):
    async with await BsonClient.connect("127.0.0.1", port) as cl:
        sub = await cl.subscribe(channel, start_pos=0)
        got = []
        try:
            while True:
                ev = await asyncio.wait_for(sub.__anext__(), timeout)
                got.append(ev.event["i"])
        except (asyncio.TimeoutError, StopAsyncIteration):
            pass
        return got


def test_bson_transaction_waits_for_a_majority_and_survives_a_failover_whole(docs3):
    c = docs3
    # two channels led by one node (a transaction of events commits on the node leading all its streams)
    async def make(port, name):
        async with await BsonClient.connect("127.0.0.1", port) as cl:
            await cl.create_channel(name)
    leaders = {}
    for i in range(6):
        name = f"tx{i}"
        run(make(c.nodes["n1"].ports["bson"], name))
        leaders[name] = leader_of(c, name)
        pair = [ch for ch in leaders if leaders[ch] == leaders[name]]
        if len(pair) == 2:
            break
    ch1, ch2 = pair
    leader = leaders[ch1]
    followers = [n for n in c.nodes if n != leader]
    c.wait(lambda st: all(m["lag"] == 0 for s in st["streams"] if s["name"] in pair for m in s["members"]))

    # on a node that leads neither: refused clearly, nothing stored
    async def refused(port):
        async with await BsonClient.connect("127.0.0.1", port) as cl:
            await cl.start_tx(1)
            await cl.publish(ch1, {"ch": ch1, "i": -1}, sess_id=1)
            await cl.publish(ch2, {"ch": ch2, "i": -1}, sess_id=1)
            with pytest.raises(BsonError) as e:
                await cl.commit_tx(1)
            return str(e.value)
    msg = run(refused(c.nodes[followers[0]].ports["bson"]))
    assert "not the leader" in msg, msg

    async def transaction(port):
        cl = await committx(port, [ch1, ch2], 100)()
        try:
            # both followers paused: no majority holds the chunks, so no acknowledgement
            for f in followers:
                os.kill(c.nodes[f].pid, signal.SIGSTOP)
            commit = asyncio.ensure_future(cl.commit_tx(7))
            try:
                await asyncio.sleep(0.4)
                assert not commit.done(), "COMMITTX acknowledged while no majority held it"
            finally:
                os.kill(c.nodes[followers[0]].pid, signal.SIGCONT)
            await asyncio.wait_for(commit, 10)       # one follower back: a majority holds it
        finally:
            os.kill(c.nodes[followers[1]].pid, signal.SIGCONT)
            await cl.close()
    run(transaction(c.nodes[leader].ports["bson"]))
    # acknowledged: kill -9 the leader at once; the new leaders have the whole transaction
    c.nodes[leader].kill()
    for ch in (ch1, ch2):
        new = leader_of(c, ch, not_this=leader)
        got = eventually(lambda: run(read_all(c.nodes[new].ports["bson"], ch)) or None, what=f"{ch}'s events")
        assert got == list(range(100)), (ch, got[:5], len(got))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-x", "-q"]))

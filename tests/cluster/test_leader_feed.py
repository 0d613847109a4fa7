"""The leader's side of the replication port (shells/cluster/replication.py, issue 23): what a member
connection is sent after a publish, and when the publish is confirmed. The leader is the real serving code
(``ReplicationPlane._serve_member``, ``Leading``) on a real engine; the member is this test speaking the
frames (wire.py) over a loopback socket.

Guarantees checked here: a publish is confirmed only once a majority (the leader and one of two members)
holds it, and the leader's readers never see past the committed offset. Latency mechanics checked here: a
publish's chunk is written to a parked member connection in the call that hands the append over (no task
wake-up in between), and a committed offset that no later chunk carries still reaches the member at once,
long before the heartbeat."""

import asyncio

import pytest

from riverbed.engine import Engine
from riverbed.engine.format import H_CHUNK_ID
from riverbed.shells.cluster import wire
from riverbed.shells.cluster.replication import COMMIT_DELAY, Leading, ReplicationPlane

TTL = 40.0          # the heartbeat COMMIT (every TTL / 4) never fires within a test
WAIT = 2.0          # seconds a frame may take to arrive on a loaded machine (far below TTL / 4)


class LeaderNode(ReplicationPlane):
    """What the serving code and Leading read of a ClusterNode: the leader of stream ``s`` (members
    ``leader``, ``m1``, ``m2``: a majority is the leader and one member) with a valid lease."""

    def __init__(self, engine):
        self.engine = engine
        self.name = "leader"
        self.ttl = TTL
        self.replication_timeout = 30.0
        self.placements = {}
        self.leading = {}

    @staticmethod
    def lease_valid():
        return True


def publish(node, st, record):
    """What ClusterNode.hold does with an append: wait for the majority, let the members know. Returns
    ``(end offset, future of the confirm)``."""
    res = node.engine.append("s", [record]).result()
    end = res.last_offset + 1
    confirmed = asyncio.get_running_loop().create_future()
    st.wait(end, lambda err: confirmed.done() or confirmed.set_result(err))
    st.recompute()
    st.poke()
    return end, confirmed


async def frames_until(reader, kind):
    """The frames read up to and including the first of type ``kind``."""
    out = []
    while True:
        k, payload = await asyncio.wait_for(wire.read_frame(reader), WAIT)
        out.append((k, payload))
        if k == kind:
            return out


@pytest.fixture
def leader_engine(tmp_path):
    engine = Engine(tmp_path / "leader", fsync="never", retention_interval=0)
    engine.create_stream("s").result()
    engine.set_read_limit("s", 0)
    yield engine
    engine.close()


def test_confirm_waits_for_a_member_and_its_commit_arrives_without_a_later_publish(leader_engine):
    async def run():
        node = LeaderNode(leader_engine)
        st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            writer.write(wire.json_frame(wire.HELLO, {"node": "m1", "stream": "s", "epoch": 1, "next": 0,
                                                      "last": None}))
            first = await frames_until(reader, wire.COMMIT)
            assert first == [(wire.COMMIT, wire.u64_frame(wire.COMMIT, 0)[5:])]
            await asyncio.sleep(0.05)         # the serving task parks
            (feed,) = st.feeds
            assert feed.parked

            for n in range(1, 4):
                end, confirmed = publish(node, st, b"record %d" % n)
                # written in the poke itself: the feed is past the chunk before this test yields once
                assert feed.pos == end
                got = await frames_until(reader, wire.CHUNK)
                assert [k for k, _ in got] == [wire.SEQS, wire.CHUNK]
                assert wire.decode_chunk(got[-1][1])[H_CHUNK_ID] == end - 1
                # only the leader holds it: no majority, no confirm, nothing visible to the leader's readers
                await asyncio.sleep(0.05)
                assert not confirmed.done()
                assert leader_engine.read_limit("s") == end - 1
                writer.write(wire.u64_frame(wire.ACK, end))
                assert await asyncio.wait_for(confirmed, WAIT) is None
                assert leader_engine.read_limit("s") == end
                # no later publish carries the new committed offset: it comes on its own within COMMIT_DELAY
                # (plus the loop's and the machine's delay), not with the heartbeat TTL / 4 later
                t0 = asyncio.get_running_loop().time()
                got = await frames_until(reader, wire.COMMIT)
                assert got[-1] == (wire.COMMIT, wire.u64_frame(wire.COMMIT, end)[5:])
                assert asyncio.get_running_loop().time() - t0 < WAIT
                assert [k for k, _ in got] == [wire.COMMIT]
        finally:
            writer.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())


def test_commit_rides_with_the_next_chunk_when_it_comes_first(leader_engine, monkeypatch):
    """A publish that follows a confirm within COMMIT_DELAY carries the moved committed offset: the
    member gets the chunk, its sequences and the COMMIT together, and no COMMIT of its own after them."""
    import riverbed.shells.cluster.replication as replication
    monkeypatch.setattr(replication, "COMMIT_DELAY", 5.0)

    async def run():
        node = LeaderNode(leader_engine)
        st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            writer.write(wire.json_frame(wire.HELLO, {"node": "m1", "stream": "s", "epoch": 1, "next": 0,
                                                      "last": None}))
            await frames_until(reader, wire.COMMIT)
            await asyncio.sleep(0.05)
            end, confirmed = publish(node, st, b"one")
            await frames_until(reader, wire.CHUNK)
            writer.write(wire.u64_frame(wire.ACK, end))
            assert await asyncio.wait_for(confirmed, WAIT) is None
            end2, confirmed2 = publish(node, st, b"two")
            got = await frames_until(reader, wire.COMMIT)
            assert [k for k, _ in got] == [wire.SEQS, wire.CHUNK, wire.COMMIT]
            assert got[-1][1] == wire.u64_frame(wire.COMMIT, end)[5:]
            with pytest.raises(asyncio.TimeoutError):       # nothing more until the next publish
                await asyncio.wait_for(wire.read_frame(reader), 0.3)
            assert not confirmed2.done()
        finally:
            writer.close()
            server.close()
            await server.wait_closed()
    assert COMMIT_DELAY < 0.05
    asyncio.run(run())


def test_two_members_at_the_same_place_share_one_read_of_the_chunks(leader_engine, monkeypatch):
    """Both member connections get the publish's chunk from ONE read of the leader's log (the chunk is
    copied out of LMDB once, not once per member), and the same bytes; a later publish is read anew."""
    reads = []
    real = leader_engine.read_for_replica

    def counted(name, pos, *args, **kw):
        got = real(name, pos, *args, **kw)
        reads.append((pos, len(got[0])))
        return got
    monkeypatch.setattr(leader_engine, "read_for_replica", counted)

    async def run():
        node = LeaderNode(leader_engine)
        st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conns = []
        try:
            for m in ("m1", "m2"):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(wire.json_frame(wire.HELLO, {"node": m, "stream": "s", "epoch": 1, "next": 0,
                                                          "last": None}))
                await frames_until(reader, wire.COMMIT)
                conns.append((reader, writer))
            await asyncio.sleep(0.05)         # both serving tasks park
            assert len(st.feeds) == 2 and all(f.parked for f in st.feeds)
            for n in range(1, 3):
                reads.clear()
                end, _ = publish(node, st, b"record %d" % n)
                got = [await frames_until(reader, wire.CHUNK) for reader, _ in conns]
                assert got[0] == got[1]
                assert wire.decode_chunk(got[0][-1][1])[H_CHUNK_ID] == end - 1
                assert [r for r in reads if r[1]] == [(end - 1, 1)], reads
        finally:
            for _, writer in conns:
                writer.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())

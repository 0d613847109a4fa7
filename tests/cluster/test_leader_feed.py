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
import contextlib

import pytest

from riverbed.engine import Engine
from riverbed.engine.format import H_CHUNK_ID, H_RECORDS
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


@contextlib.asynccontextmanager
async def member_of(leader_engine):
    """A leader node leading stream "s" (members leader, m1, m2) and a connection to its replication server
    that sent m1's HELLO: yields ``(node, st, reader, writer)``; the connection and server closed at the end."""
    node = LeaderNode(leader_engine)
    st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
    server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    try:
        writer.write(wire.json_frame(wire.HELLO, {"node": "m1", "stream": "s", "epoch": 1, "next": 0,
                                                  "last": None}))
        yield node, st, reader, writer
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


def count_reads(engine, monkeypatch):
    """Wrap ``engine.read_replica_views`` (what a member connection reads the log with): the list it returns
    gets (position, chunks read) per call."""
    reads = []
    real = engine.read_replica_views

    def counted(name, pos, fn, *args, **kw):
        def seen(chunks, seqs):
            reads.append((pos, len(chunks)))
            return fn(chunks, seqs)
        return real(name, pos, seen, *args, **kw)
    monkeypatch.setattr(engine, "read_replica_views", counted)
    return reads


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


def publish_many(node, st, records):
    """:func:`publish` of several records in one append; returns its end offset."""
    res = node.engine.append("s", records).result()
    st.recompute()
    st.poke()
    return res.last_offset + 1


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
        async with member_of(leader_engine) as (node, st, reader, writer):
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
    asyncio.run(run())


def test_commit_rides_with_the_next_chunk_when_it_comes_first(leader_engine, monkeypatch):
    """A publish that follows a confirm within COMMIT_DELAY carries the moved committed offset: the
    member gets the chunk, its sequences and the COMMIT together, and no COMMIT of its own after them."""
    import riverbed.shells.cluster.replication as replication
    monkeypatch.setattr(replication, "COMMIT_DELAY", 5.0)

    async def run():
        async with member_of(leader_engine) as (node, st, reader, writer):
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
    assert COMMIT_DELAY < 0.05
    asyncio.run(run())


# ------------------------------------------------------------------ chunks sent ahead of the local commit

def publish_inline(node, st, record):
    """A one-message publish as the broker makes it in a cluster: the engine commits it on this (the loop's)
    thread, handing the stamped chunk to ``engine.replica_feed`` before LMDB commits it; then what
    ClusterNode.hold does. Returns ``(end offset or None, exc, future of the confirm)``."""
    got = []
    node.engine.append("s", [record], on_done=lambda res, exc: got.append((res, exc)))
    assert got, "not committed inline"
    res, exc = got[0]
    confirmed = asyncio.get_running_loop().create_future()
    if exc is not None:
        return None, exc, confirmed
    end = res.last_offset + 1
    st.wait(end, lambda err: confirmed.done() or confirmed.set_result(err))
    st.recompute()
    st.poke_behind(end)
    return end, None, confirmed


async def joined(node, st, reader, writer, next_offset=0, last=None):
    """HELLO as member m1; returns its feed once the serving task has parked."""
    writer.write(wire.json_frame(wire.HELLO, {"node": "m1", "stream": "s", "epoch": 1, "next": next_offset,
                                              "last": last}))
    await frames_until(reader, wire.COMMIT)
    for _ in range(100):
        await asyncio.sleep(0.01)
        if st.feeds and next(iter(st.feeds)).parked:
            return next(iter(st.feeds))
    raise AssertionError("the serving task never parked")


def test_chunk_leaves_before_the_local_commit_and_counts_only_once_stored_here(leader_engine):
    """The member gets the chunk (and its publisher sequence) while the leader has not committed it yet;
    the confirm still needs the member's ACK, and an ACK past the leader's own log end moves the committed
    offset no further than that end."""
    from riverbed.shells.cluster.leader_path import SendAhead

    async def run():
        node = LeaderNode(leader_engine)
        st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        ahead = leader_engine.replica_feed = SendAhead(node)
        at_send = []
        sealed = ahead.sealed

        def spy(name, chunk_id, records, chunk, sequences):
            # what the leader's readers and its own log say at the moment the chunk goes out
            at_send.append((leader_engine._current(name).next_offset, chunk_id, sequences))
            return sealed(name, chunk_id, records, chunk, sequences)
        ahead.sealed = spy
        server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            feed = await joined(node, st, reader, writer)
            for n in range(4):
                end, exc, confirmed = publish_inline(node, st, b"ahead %d" % n)
                assert exc is None
                assert at_send[-1][:2] == (n, n)          # the hook ran while the leader's log ended before it
                # the first chunk on a connection goes after the commit, with the whole sequence table (a
                # member that truncated its log lost its table); the others go ahead of the commit
                assert feed.pos == end and ahead.sent == n
                got = await frames_until(reader, wire.CHUNK)
                assert [k for k, _ in got if k != wire.COMMIT] == [wire.SEQS, wire.CHUNK]
                assert wire.decode_chunk(got[-1][1])[H_CHUNK_ID] == n
                await asyncio.sleep(0.05)
                assert not confirmed.done() and leader_engine.read_limit("s") == n
                # the last one: both members (m2 as if it had acknowledged) past the leader's log end move
                # the committed offset only to that end (nothing counts that the leader has not stored)
                if n == 3:
                    st.acked["m2"] = end + 10
                writer.write(wire.u64_frame(wire.ACK, end + (10 if n == 3 else 0)))
                assert await asyncio.wait_for(confirmed, WAIT) is None
                assert st.committed == end and leader_engine.read_limit("s") == end
            # a named publisher's sequence travels with its chunk
            got = []
            from riverbed.engine.layout import PublishingIds
            ids = PublishingIds((7).to_bytes(8, "big"), 7, 7, True)     # as the RabbitMQ Stream shell makes them
            leader_engine.append("s", [b"named"], publisher="pa", publishing_ids=ids,
                                 on_done=lambda res, exc: got.append((res, exc)))
            assert got and got[0][1] is None
            frames = await frames_until(reader, wire.CHUNK)
            assert (wire.SEQS, b'{"pa":7}') in frames
            assert at_send[-1][2] == {"pa": 7}
        finally:
            writer.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())


class _FailingCommit:
    """``engine.env`` whose next write transaction fails at its commit (after every put went through)."""

    def __init__(self, env):
        self.env = env
        self.armed = True

    def __getattr__(self, name):
        return getattr(self.env, name)

    def begin(self, db=None, parent=None, write=False, buffers=False):
        # py-lmdb's positional order: the one-message commit calls begin(None, None, True, True)
        txn = self.env.begin(db=db, parent=parent, write=write, buffers=buffers)
        if not (write and self.armed):
            return txn
        self.armed = False
        return _FailAtExit(txn)


class _FailAtExit:
    def __init__(self, txn):
        self.txn = txn

    def __enter__(self):
        return self.txn.__enter__()

    def __exit__(self, kind, exc, tb):
        self.txn.abort()
        if kind is None:
            import lmdb
            raise lmdb.Error("injected: the commit failed")
        return False


def test_a_local_commit_failing_after_the_send_drops_the_members_copy(leader_engine):
    """The chunk went to the member, then the leader's commit of it failed: the publish fails, the engine
    stops (as after any failed commit), the member's connection is closed at once (its ACK of that chunk
    never counts), and when it comes back its HELLO names a chunk the leader does not hold: it is told to
    TRUNCATE it."""
    from riverbed.engine.errors import RiverbedError
    from riverbed.engine.format import H_CRC, H_EPOCH
    from riverbed.shells.cluster.leader_path import SendAhead

    async def run():
        node = LeaderNode(leader_engine)
        st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        leader_engine.replica_feed = SendAhead(node)
        server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await joined(node, st, reader, writer)
            end, exc, confirmed = publish_inline(node, st, b"first")      # sent after its commit: see above
            await frames_until(reader, wire.CHUNK)
            writer.write(wire.u64_frame(wire.ACK, end))
            assert await asyncio.wait_for(confirmed, WAIT) is None
            real = leader_engine.env
            leader_engine.env = _FailingCommit(real)
            try:
                end, exc, _ = publish_inline(node, st, b"lost")
            finally:
                leader_engine.env = real
            assert end is None and isinstance(exc, RiverbedError)
            assert leader_engine._current("s").next_offset == 1
            got = await frames_until(reader, wire.CHUNK)
            h = wire.decode_chunk(got[-1][1])
            assert h[H_CHUNK_ID] == 1
            # dropped: the leader closed the connection, and the member counts no further than before
            assert st.feeds == set() and st.acked["m1"] == 1
            with pytest.raises(asyncio.IncompleteReadError):
                while True:
                    await asyncio.wait_for(wire.read_frame(reader), WAIT)
            writer.close()
            assert st.committed == 1 and leader_engine.read_limit("s") == 1
            # the member returns holding the chunk: it must cut it
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(wire.json_frame(wire.HELLO, {"node": "m1", "stream": "s", "epoch": 1, "next": 2,
                                                      "last": [1, h[H_EPOCH], h[H_CRC]]}))
            kind, payload = await asyncio.wait_for(wire.read_frame(reader), WAIT)
            assert (kind, wire.u64(payload)) == (wire.TRUNCATE, 1)
            # the engine stops after a failed commit, as it does on its general path: this node never
            # stores another chunk at the id its members were sent
            with pytest.raises(RiverbedError):
                leader_engine.append("s", [b"next"]).result()
        finally:
            writer.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())


def test_chunk_goes_ahead_to_a_majority_first_the_rest_once_committed(leader_engine):
    """Two members: the chunk goes ahead of the local commit to one of them (a majority with the leader),
    the member whose ACK made the last majority first; the other gets the very same frames once that
    majority holds it (in the loop turn of the ACK that makes it, after the confirm), or after
    BEHIND_WAIT when the first member does not answer, and then its ACK makes the majority. Both hold
    every chunk."""
    from riverbed.shells.cluster.leader_path import SendAhead

    async def run():
        node = LeaderNode(leader_engine)
        st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        ahead = leader_engine.replica_feed = SendAhead(node)
        at_send = []
        sealed = ahead.sealed

        def spy(*a):
            sent = sealed(*a)
            at_send.append({f.member: f.pos for f in st.feeds})
            return sent
        ahead.sealed = spy
        server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conns = {}
        try:
            for m in ("m1", "m2"):
                reader, writer = conns[m] = await asyncio.open_connection("127.0.0.1", port)
                writer.write(wire.json_frame(wire.HELLO, {"node": m, "stream": "s", "epoch": 1, "next": 0,
                                                          "last": None}))
                await frames_until(reader, wire.COMMIT)
            for _ in range(100):
                await asyncio.sleep(0.01)
                if len(st.feeds) == 2 and all(f.parked for f in st.feeds):
                    break
            end, _, confirmed = publish_inline(node, st, b"first")    # after the commit, to both
            for m, (reader, writer) in conns.items():
                await frames_until(reader, wire.CHUNK)
            conns["m2"][1].write(wire.u64_frame(wire.ACK, end))
            assert await asyncio.wait_for(confirmed, WAIT) is None
            conns["m1"][1].write(wire.u64_frame(wire.ACK, end))
            assert st.fastest == "m2"
            def check(got, end):
                assert [k for k, _ in got if k != wire.COMMIT] == [wire.SEQS, wire.CHUNK]
                assert wire.decode_chunk(got[-1][1])[H_CHUNK_ID] == end - 1

            for n in range(1, 5):
                end, _, confirmed = publish_inline(node, st, b"next %d" % n)
                first = st.fastest
                other = "m1" if first == "m2" else "m2"
                # at the send: only the last majority-maker was sent it; after the commit still only it
                assert at_send[-1] == {first: end, other: end - 1}
                assert {f.member: f.pos for f in st.feeds} == {first: end, other: end - 1}
                if n % 2:
                    # the first member answers: the other gets the same frames in that ACK's loop turn
                    check(await frames_until(conns[first][0], wire.CHUNK), end)
                    conns[first][1].write(wire.u64_frame(wire.ACK, end))
                    assert await asyncio.wait_for(confirmed, WAIT) is None
                    assert {f.member: f.pos for f in st.feeds} == {first: end, other: end}
                    check(await frames_until(conns[other][0], wire.CHUNK), end)
                    conns[other][1].write(wire.u64_frame(wire.ACK, end))
                    assert st.fastest == first
                else:
                    # the first member is silent: the other gets it after BEHIND_WAIT, and its ACK makes
                    # the majority; it gets the next chunk first
                    check(await frames_until(conns[other][0], wire.CHUNK), end)
                    assert not confirmed.done()
                    conns[other][1].write(wire.u64_frame(wire.ACK, end))
                    assert await asyncio.wait_for(confirmed, WAIT) is None
                    check(await frames_until(conns[first][0], wire.CHUNK), end)
                    conns[first][1].write(wire.u64_frame(wire.ACK, end))
                    assert st.fastest == other
            assert ahead.sent == 4
        finally:
            for reader, writer in conns.values():
                writer.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())


def test_two_members_get_the_same_chunk_bytes_straight_from_the_map(leader_engine, monkeypatch):
    """Both member connections get the publish's chunk written from LMDB's map (each its own read
    transaction, no copy of the chunk: the socket took it all), and the same bytes; a later publish is read
    anew."""
    reads = count_reads(leader_engine, monkeypatch)

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
                assert got[0][-1][1] == leader_engine.read_chunks("s", end - 1, 1, limited=False)[0][1]
                assert [r for r in reads if r[1]] == [(end - 1, 1), (end - 1, 1)], reads
            assert st.copied == 0
        finally:
            for _, writer in conns:
                writer.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())


def test_what_a_full_socket_does_not_take_is_copied_and_follows_in_order(leader_engine):
    """A member that does not read (a small receive buffer, full): the leader's write from the map takes
    only part of a large batch; the rest is copied before the read transaction ends and queued, and
    everything after it waits behind it. The member then reads every chunk, byte for byte as stored, in
    order, with the chunks of a later publish after them."""
    import socket

    async def run():
        node = LeaderNode(leader_engine)
        st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 24)
        try:
            writer.write(wire.json_frame(wire.HELLO, {"node": "m1", "stream": "s", "epoch": 1, "next": 0,
                                                      "last": None}))
            await frames_until(reader, wire.COMMIT)
            await asyncio.sleep(0.05)
            (feed,) = st.feeds
            assert feed.parked
            # not read by the member while the leader sends: its socket fills up
            big = [bytes([65 + i % 26]) * 1000 for i in range(4000)]
            ends = [publish_many(node, st, big)]
            await asyncio.sleep(0.05)
            # what the socket did not take is not copied: a piece of the chunk it stopped in wakes the task
            assert 0 < st.copied <= len(big) * 1000 // 4
            ends.append(publish_many(node, st, [b"after"] * 10))
            chunks = []
            while not chunks or chunks[-1][0] < ends[-1]:
                k, payload = await asyncio.wait_for(wire.read_frame(reader), WAIT)
                if k == wire.CHUNK:
                    h = wire.decode_chunk(payload)
                    chunks.append((h[H_CHUNK_ID] + h[H_RECORDS], payload))
            stored = leader_engine.read_chunks("s", 0, 1000, limited=False)
            assert [bytes(p) for _, p in chunks] == [raw for _, raw in stored]
        finally:
            writer.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())


def test_a_send_cut_anywhere_goes_on_byte_for_byte(leader_engine, monkeypatch):
    """The socket takes a random number of bytes of every write (1 byte to a few KiB): cut in a SEQS, a
    chunk header, a chunk, a COMMIT. The member still reads exactly the log's chunks, each once and in
    order, a SEQS before the last chunk of each batch that reached the log end, and the final committed
    offset; no chunk is copied whole (only pieces of at most PIECE bytes)."""
    import os
    import random
    import types

    import riverbed.shells.cluster.replication as replication
    rng = random.Random(23)

    def writev(fd, bufs):
        room = rng.choice([1, 2, 5, 7, 100, 999, 3000, 5000])
        cut = []
        for b in bufs:
            if room <= 0:
                break
            cut.append(b[:room])
            room -= len(cut[-1])
        return os.writev(fd, cut)
    monkeypatch.setattr(replication, "os", types.SimpleNamespace(writev=writev))
    monkeypatch.setattr(replication, "PIECE", 64)

    async def run():
        async with member_of(leader_engine) as (node, st, reader, writer):
            end = 0
            for n in range(12):
                end = publish_many(node, st, [b"%d-%d" % (n, i) * 40 for i in range(1 + n * 37)])
                if n % 4 == 1:
                    # a consumer offset: an OFFSETS frame rides behind the chunks, and may be cut off too
                    leader_engine.store_offset("s", "c%d" % (n // 4 % 2), end - 1).result()
                if n % 3 == 0:
                    await asyncio.sleep(0.01)
            writer.write(wire.u64_frame(wire.ACK, end))
            chunks, seqs_before, commit, offsets = [], [], -1, {}
            while commit < end or offsets != leader_engine.stored_offsets("s"):
                k, payload = await asyncio.wait_for(wire.read_frame(reader), WAIT)
                if k == wire.OFFSETS:
                    offsets.update(wire.decode_offsets(payload))
                if k == wire.CHUNK:
                    h = wire.decode_chunk(payload)
                    chunks.append(bytes(payload))
                    seqs_before.append(prev == wire.SEQS)
                elif k == wire.SEQS:
                    wire.decode_seqs(payload)
                elif k == wire.COMMIT:
                    commit = wire.u64(payload)
                prev = k
            assert commit == end and offsets == {"c0": offsets["c0"], "c1": offsets["c1"]}
            stored = [raw for _, raw in leader_engine.read_chunks("s", 0, 10000, limited=False)]
            assert chunks == stored
            assert seqs_before[-1]          # the last chunk of the log came with its publisher sequences
            assert st.copied < sum(map(len, stored)) // 4
            assert h is not None
    asyncio.run(run())


def _ahead_connection(leader_engine):
    """A leader with SendAhead and member m1 joined (this test, over loopback): ``(node, st, feed, reader,
    writer, close)``."""
    from riverbed.shells.cluster.leader_path import SendAhead

    async def make():
        node = LeaderNode(leader_engine)
        st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        leader_engine.replica_feed = SendAhead(node)
        server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        feed = await joined(node, st, reader, writer)
        # the first chunk on a connection goes after the commit, with the whole sequence table: after it,
        # chunks go ahead (the case poll_acks is for)
        end, exc, confirmed = publish_inline(node, st, b"first")
        await frames_until(reader, wire.CHUNK)
        writer.write(wire.u64_frame(wire.ACK, end))
        assert await asyncio.wait_for(confirmed, WAIT) is None

        async def close():
            writer.close()
            server.close()
            await server.wait_closed()
        return node, st, feed, reader, writer, close
    return make()


def test_a_lone_confirm_polls_for_its_ack_and_is_written_before_the_loop_runs_again(leader_engine):
    """poll_acks (leader_path.py): the member's ACK, sent from another thread while the loop's thread polls,
    is handled in place: the committed offset moves and the confirm's callback runs before poll_acks
    returns, with no turn of the loop in between (the loop is busy in it)."""
    import socket
    import threading

    from riverbed.shells.cluster import leader_path

    async def run():
        node, st, feed, reader, writer, close = await _ahead_connection(leader_engine)
        try:
            # the member's socket, duplicated for a thread to write on
            sock = socket.fromfd(writer.transport.get_extra_info("socket").fileno(), socket.AF_INET,
                                 socket.SOCK_STREAM)
            for n in range(3):
                end, exc, confirmed = publish_inline(node, st, b"polled %d" % n)
                assert exc is None and feed.pos == end and not confirmed.done()
                assert st.ahead_end == end      # sent ahead: ClusterNode.hold polls only for such a chunk
                # the member answers 20 ms later, on its own thread: the loop's thread is polling then
                threading.Timer(0.02, sock.sendall, [wire.u64_frame(wire.ACK, end)]).start()
                assert leader_path.poll_acks(st, end, 5.0) is True
                assert st.committed == end and leader_engine.read_limit("s") == end
                assert confirmed.done() and confirmed.result() is None
                got = await frames_until(reader, wire.CHUNK)
                assert wire.decode_chunk(got[-1][1])[H_CHUNK_ID] == end - 1
            sock.close()
        finally:
            await close()
    asyncio.run(run())


def test_polling_gives_up_after_its_budget_and_the_ack_then_comes_through_the_loop(leader_engine):
    """No ACK within the budget: poll_acks returns False after about ``budget`` seconds, nothing moved;
    the ACK that comes later is read by the connection's transport as before. A member connection that
    ends while polled: poll_acks returns at once and leaves the end of file to the transport."""
    import time

    from riverbed.shells.cluster import leader_path

    async def run():
        node, st, feed, reader, writer, close = await _ahead_connection(leader_engine)
        try:
            end, exc, confirmed = publish_inline(node, st, b"late ack")
            t0 = time.perf_counter()
            assert leader_path.poll_acks(st, end, 0.05) is False
            assert 0.05 <= time.perf_counter() - t0 < 0.05 + WAIT
            assert st.committed == end - 1 and not confirmed.done()
            writer.write(wire.u64_frame(wire.ACK, end))
            assert await asyncio.wait_for(confirmed, WAIT) is None

            end, exc, confirmed = publish_inline(node, st, b"member gone")
            await frames_until(reader, wire.CHUNK)
            writer.close()
            await asyncio.sleep(0.05)      # the FIN is on the leader's socket before the poll starts
            t0 = time.perf_counter()
            assert leader_path.poll_acks(st, end, 5.0) is False
            assert time.perf_counter() - t0 < 1.0
            assert not confirmed.done()
            for _ in range(200):            # the transport reads the end of file: the connection ends
                if feed.acker.closed:
                    break
                await asyncio.sleep(0.01)
            assert feed.acker.closed
        finally:
            await close()
    asyncio.run(run())

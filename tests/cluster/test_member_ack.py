"""A member's ACK on the replication port (shells/cluster/replication.py, issue 23): it acknowledges a chunk
only once the chunk is durable under the stream's fsync policy, one ACK per batch of chunks it stores in
one transaction. The member is the real follow loop on a real engine; the leader is this test speaking
the replication frames (wire.py) over a loopback socket, with chunks a real leader engine made."""

import asyncio
import time

import pytest

from riverbed.engine import Engine, core
from riverbed.engine.format import H_CHUNK_ID, H_RECORDS
from riverbed.engine.layout import _CHUNK_KEY
from riverbed.shells.cluster import wire
from riverbed.shells.cluster.remote_read import Observers
from riverbed.shells.cluster.replication import ReplicationPlane

SYNC_DELAY = 0.1      # seconds each fsync of the member takes here: an early ACK lands inside it


class SlowSyncEnv:
    """The member engine's LMDB environment, with an fsync that takes SYNC_DELAY and then records how far
    the committed log is durable (``durable``: the next offset after the last chunk on disk)."""

    def __init__(self, env, engine):
        self._env = env
        self._engine = engine
        self.durable = 0
        self.syncs = 0

    def __getattr__(self, name):
        return getattr(self._env, name)

    def sync(self, force=False):
        time.sleep(SYNC_DELAY)
        with self._env.begin(db=self._engine._db_chunks) as txn:
            cur = txn.cursor()
            end = 0
            if cur.last():
                _, chunk_id = _CHUNK_KEY.unpack(cur.key())
                end = chunk_id + core.read_header(cur.value())[H_RECORDS]
        self._env.sync(force)
        self.durable = end
        self.syncs += 1


class Member(ReplicationPlane):
    """Just what the follow loop reads of a ClusterNode: a member (no observed streams) with no broker
    (nothing here deletes a stream, the one thing Observers asks the broker about)."""

    class _NoDeletes:
        def on_stream_deleted(self, fn):
            pass

    def __init__(self, engine):
        self.engine = engine
        self.name = "member"
        self.max_epoch = {}
        self.broker = self._NoDeletes()
        self.observers = Observers(self)


@pytest.fixture
def engines(tmp_path):
    leader = Engine(tmp_path / "leader", fsync="never", retention_interval=0)
    member = Engine(tmp_path / "member", fsync="never", retention_interval=0)
    yield leader, member
    leader.close()
    member.close()


def leader_batches(leader, n_batches, chunks_per_batch):
    """``[(chunks, sequences)]``: the leader's log cut into batches as _serve_member sends them."""
    leader.create_stream("s").result()
    for i in range(n_batches * chunks_per_batch):
        leader.append("s", [b"m%d-%d" % (i, j) for j in range(10)], publishing_ids=list(range(10 * i, 10 * i + 10)),
                      publisher="p").result()
    all_chunks = [raw for _, raw in leader.read_chunks("s", 0, 10_000, limited=False)]
    out = []
    for b in range(n_batches):
        part = all_chunks[b * chunks_per_batch:(b + 1) * chunks_per_batch]
        last = core.read_header(part[-1])
        out.append((part, {"p": last[H_CHUNK_ID] + last[H_RECORDS] - 1}))
    return out


def batch_frames(chunks, seqs):
    """The frames of one batch as the leader sends them: SEQS before its last chunk."""
    out = []
    for i, raw in enumerate(chunks):
        if i == len(chunks) - 1:
            out.append(wire.json_frame(wire.SEQS, seqs))
        out += [wire.head(wire.CHUNK, len(raw)), raw]
    return out


async def run_leader(batches, member, on_ack, one_write=False):
    """Serve one member connection: send every batch, each once the member acknowledged the one before
    (or, ``one_write``, all of them in one write), read the ACKs until the member holds everything;
    ``on_ack(offset)`` at each ACK as it arrives."""
    end = batches[-1][1]["p"] + 1
    done = asyncio.get_running_loop().create_future()

    async def serve(reader, writer):
        kind, payload = await wire.read_frame(reader)
        assert kind == wire.HELLO and wire.decode_hello(payload)["stream"] == "s"
        if one_write:
            writer.writelines([f for chunks, seqs in batches for f in batch_frames(chunks, seqs)])
            await writer.drain()
        offset = -1
        for chunks, seqs in batches:
            if one_write:
                break
            writer.writelines(batch_frames(chunks, seqs))
            await writer.drain()
            while offset < seqs["p"] + 1:
                kind, payload = await wire.read_frame(reader)
                assert kind == wire.ACK
                offset = wire.u64(payload)
                on_ack(offset)
        while offset < end:
            kind, payload = await wire.read_frame(reader)
            assert kind == wire.ACK
            offset = wire.u64(payload)
            on_ack(offset)
        writer.write(wire.json_frame(wire.REFUSE, {"reason": "test over"}))   # the member's loop returns
        await writer.drain()
        done.set_result(None)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await asyncio.wait_for(member._follow_once("s", "leader", 1, {"advertised_host": "127.0.0.1",
                                                                       "replication_port": port}), 30)
        await asyncio.wait_for(done, 5)
    finally:
        server.close()


def test_member_acks_a_batch_only_once_it_is_synced(engines):
    """The stream asks for fsync=always (the member's engine: never): each batch is synced before its ACK
    goes out. A member that acknowledged on receipt, or before its commit's sync, fails here: every ACK
    lands while the slow sync is still under way."""
    leader, member = engines
    batches = leader_batches(leader, 3, 4)
    member.create_stream("s", {"fsync": "always"}).result()
    spy = member.env = SlowSyncEnv(member.env, member)
    seen = []

    def on_ack(offset):
        seen.append((offset, spy.durable))      # what was durable when the ACK arrived

    asyncio.run(run_leader(batches, Member(member), on_ack))
    end = batches[-1][1]["p"] + 1
    assert seen[-1][0] == end
    early = [(off, durable) for off, durable in seen if off > durable]
    assert not early, f"ACKs (offset, durable then) before their chunks were synced: {early}"
    assert spy.syncs >= 1
    assert member.read_chunks("s", 0, 10_000, limited=False) == leader.read_chunks("s", 0, 10_000, limited=False)
    assert member.query_publisher_sequence("s", "p") == end - 1


def test_member_stores_a_batch_in_one_commit_and_acks_it_once(engines):
    """fsync=never: the chunks held until their sequences arrive are stored in one transaction, with one
    ACK per batch (not one per chunk), each naming the batch's end."""
    leader, member = engines
    batches = leader_batches(leader, 3, 4)
    member.create_stream("s").result()
    commits = member.stats.group_commits
    acks = []
    asyncio.run(run_leader(batches, Member(member), acks.append))
    ends = [seqs["p"] + 1 for _, seqs in batches]
    assert acks == ends
    assert member.stats.group_commits - commits == len(batches)
    assert member.query_publisher_sequence("s", "p") == ends[-1] - 1


def test_batches_that_arrive_in_one_read_are_stored_in_one_commit_with_one_ack(engines):
    """Several whole batches in one read (a leader that sent them together): one transaction and one
    ACK for all of them, naming the last batch's end, with the sequences of the last batch; the log is
    the leader's byte for byte. A member storing (and acknowledging) each batch apart fails here."""
    leader, member = engines
    batches = leader_batches(leader, 3, 4)
    member.create_stream("s").result()
    commits = member.stats.group_commits
    acks = []
    asyncio.run(run_leader(batches, Member(member), acks.append, one_write=True))
    end = batches[-1][1]["p"] + 1
    assert acks == [end]
    assert member.stats.group_commits - commits == 1
    assert member.query_publisher_sequence("s", "p") == end - 1
    assert member.read_chunks("s", 0, 10_000, limited=False) == leader.read_chunks("s", 0, 10_000, limited=False)


def test_large_chunks_are_stored_as_read_and_byte_identical(engines):
    """Chunks far larger than a read (each lands in its own buffer, read in many pieces) are stored
    byte for byte as the leader holds them, one commit and one ACK per batch."""
    leader, member = engines
    leader.create_stream("s", {"chunk-max-records": 100_000}).result()
    body = bytes(range(256)) * 8
    for i in range(6):
        leader.append("s", [body + b"%d-%d" % (i, j) for j in range(300)],
                      publishing_ids=list(range(300 * i, 300 * i + 300)), publisher="p").result()
    chunks = [raw for _, raw in leader.read_chunks("s", 0, 10_000, limited=False)]
    assert len(chunks) == 6 and all(len(c) > 500_000 for c in chunks)
    batches = []
    for b in range(3):
        part = chunks[2 * b:2 * b + 2]
        last = core.read_header(part[-1])
        batches.append((part, {"p": last[H_CHUNK_ID] + last[H_RECORDS] - 1}))
    member.create_stream("s", {"chunk-max-records": 100_000}).result()
    commits = member.stats.group_commits
    acks = []
    asyncio.run(run_leader(batches, Member(member), acks.append))
    assert acks == [seqs["p"] + 1 for _, seqs in batches]
    assert member.stats.group_commits - commits == len(batches)
    assert member.read_chunks("s", 0, 10_000, limited=False) == leader.read_chunks("s", 0, 10_000, limited=False)


def test_a_large_frame_that_is_no_chunk_is_read_as_its_bytes(engines):
    """A SEQS of many publishers is larger than FrameReader's ``big`` (4 KiB), so it is read into a
    receive slab as a chunk is: the member decodes it (JSON from a memoryview) and stores every
    publisher's sequence with its batch. A member that handed json a memoryview failed here (TypeError,
    and the follow loop retried forever)."""
    leader, member = engines
    batches = leader_batches(leader, 2, 2)
    many = {f"publisher-{i:04d}": 1_000 + i for i in range(300)}
    batches = [(chunks, {**many, **seqs}) for chunks, seqs in batches]
    assert len(wire.json_frame(wire.SEQS, batches[0][1])) > 4 << 10
    member.create_stream("s").result()
    acks = []
    asyncio.run(run_leader(batches, Member(member), acks.append))
    assert acks == [seqs["p"] + 1 for _, seqs in batches]
    assert member.query_publisher_sequence("s", "publisher-0299") == 1_299
    assert member.query_publisher_sequence("s", "p") == batches[-1][1]["p"]


def test_a_commit_read_behind_a_chunk_moves_the_read_limit_after_that_chunk_is_acked(engines, monkeypatch):
    """A leader that sends a chunk ahead puts the moved committed offset behind it in the same write (SEQS,
    CHUNK, COMMIT): the member stores the chunk and writes its ACK first (the leader's confirm waits on
    it), then lets its readers see up to the COMMIT's offset, which covers only chunks it held already.
    The read limit still ends at that offset."""
    leader, member = engines
    batches = leader_batches(leader, 2, 1)
    member.create_stream("s").result()
    events = []
    real_ack = ReplicationPlane._ack
    monkeypatch.setattr(ReplicationPlane, "_ack", staticmethod(
        lambda writer, offset, durable: (events.append(("ack", offset)), real_ack(writer, offset, durable))))
    real_limit = member.set_read_limit
    monkeypatch.setattr(member, "set_read_limit",
                        lambda name, offset: (events.append(("limit", offset)), real_limit(name, offset)))
    (first, seqs1), (second, seqs2) = batches
    end1, end2 = seqs1["p"] + 1, seqs2["p"] + 1
    done = []

    async def run():
        async def serve(reader, writer):
            kind, _ = await wire.read_frame(reader)
            assert kind == wire.HELLO
            writer.writelines(batch_frames(first, seqs1))
            assert wire.u64((await wire.read_frame(reader))[1]) == end1
            # the second chunk, and behind it in the same write the offset the first one made committed
            writer.writelines(batch_frames(second, seqs2) + [wire.u64_frame(wire.COMMIT, end1)])
            assert wire.u64((await wire.read_frame(reader))[1]) == end2
            writer.write(wire.json_frame(wire.REFUSE, {"reason": "test over"}))
            await writer.drain()
            done.append(True)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            await asyncio.wait_for(Member(member)._follow_once("s", "leader", 1, {
                "advertised_host": "127.0.0.1", "replication_port": port}), 30)
        finally:
            server.close()
    asyncio.run(run())
    assert done
    assert events == [("ack", end1), ("ack", end2), ("limit", end1)]
    assert member.read_limit("s") == end1

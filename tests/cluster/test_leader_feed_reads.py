"""What a leader's member connection reads of its log (shells/cluster/replication.py ``_Feed.send``; issue 23's
summed CPU goal): a send that has no chunk to carry (the COMMIT after a confirm, a heartbeat) opens no read
transaction. Before, every such send read the log at the member's position, found nothing, and scanned the
stream's publisher sequences; one COMMIT followed every batch. The leader is the real serving code on a real
engine, the member this test speaking the frames (the harness of test_leader_feed.py)."""

import asyncio

from riverbed.shells.cluster import wire
from riverbed.shells.cluster.replication import Leading

from test_leader_feed import WAIT, LeaderNode, count_reads, frames_until, leader_engine, publish  # noqa: F401 (fixture)


def test_a_commit_to_a_caught_up_member_reads_nothing_and_a_chunk_is_still_read_once(leader_engine, monkeypatch):
    reads = count_reads(leader_engine, monkeypatch)

    async def run():
        node = LeaderNode(leader_engine)
        st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            writer.write(wire.json_frame(wire.HELLO, {"node": "m1", "stream": "s", "epoch": 1, "next": 0,
                                                      "last": None}))
            await frames_until(reader, wire.COMMIT)     # the first send: an empty log, nothing to read
            await asyncio.sleep(0.05)
            assert reads == []
            for n in range(1, 3):
                end, confirmed = publish(node, st, b"record %d" % n)
                got = await frames_until(reader, wire.CHUNK)
                assert [k for k, _ in got] == [wire.SEQS, wire.CHUNK]
                assert reads == [(end - 1, 1)]          # the chunk: one read
                reads.clear()
                writer.write(wire.u64_frame(wire.ACK, end))
                assert await asyncio.wait_for(confirmed, WAIT) is None
                got = await frames_until(reader, wire.COMMIT)
                assert got == [(wire.COMMIT, wire.u64_frame(wire.COMMIT, end)[5:])]
                assert reads == []                      # the COMMIT alone: no read of the log
        finally:
            writer.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())

"""What a leader's member connection reads of its log (shells/cluster/replication.py ``_Feed.send``; issue 23's
summed CPU goal): a send that has no chunk to carry (the COMMIT after a confirm, a heartbeat) opens no read
transaction. Before, every such send read the log at the member's position, found nothing, and scanned the
stream's publisher sequences; one COMMIT followed every batch. The leader is the real serving code on a real
engine, the member this test speaking the frames (the harness of test_leader_feed.py)."""

import asyncio

from riverbed.shells.cluster import wire

from test_leader_feed import WAIT, count_reads, frames_until, leader_engine, member_of, publish  # noqa: F401 (fixture)


def test_a_commit_to_a_caught_up_member_reads_nothing_and_a_chunk_is_still_read_once(leader_engine, monkeypatch):
    reads = count_reads(leader_engine, monkeypatch)

    async def run():
        async with member_of(leader_engine) as (node, st, reader, writer):
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
    asyncio.run(run())

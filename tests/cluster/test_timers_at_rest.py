"""What a cluster node does with time alone (issue 23: a node at rest cost 5-6x a lone node).

* The leader's member connection (replication.py ``_serve_member``) sends a heartbeat COMMIT only when its
  member has not been heard from for ``HEARTBEAT_EVERY`` lease TTLs, and its serving task wakes only then
  (it used to wake five times a second to find none due, and sent heartbeats while ACKs were flowing).
* The control loop's pace (pace.py): the moment a leader can first be cut off from its members is the
  moment ``ClusterNode._cut_off`` turns true, so sleeping until then misses nothing.

The leader here is the real serving code on a real engine, the member this test speaking the frames
(the harness of test_leader_feed.py)."""

import asyncio
import math
import random
import time

from riverbed.shells.cluster import pace, wire
from riverbed.shells.cluster.node import ClusterNode
from riverbed.shells.cluster.replication import HEARTBEAT_EVERY, Leading, _Feed

from test_leader_feed import LeaderNode, frames_until, leader_engine  # noqa: F401 (fixture)


async def _connect(node):
    server = await asyncio.start_server(node._serve_member, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    writer.write(wire.json_frame(wire.HELLO, {"node": "m1", "stream": "s", "epoch": 1, "next": 0, "last": None}))
    await frames_until(reader, wire.COMMIT)          # the first send
    return server, reader, writer


def test_a_silent_member_gets_one_heartbeat_per_interval_and_the_task_wakes_for_nothing_else(
        leader_engine, monkeypatch):
    sends = []
    real = _Feed.send
    monkeypatch.setattr(_Feed, "send", lambda self: sends.append(time.monotonic()) or real(self))

    async def run():
        node = LeaderNode(leader_engine)
        node.ttl = 2.0                                 # a heartbeat every 0.5 s
        node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        server, reader, writer = await _connect(node)
        try:
            sends.clear()
            t0 = time.monotonic()
            beats = []
            while time.monotonic() - t0 < 1.6:
                try:
                    kind, _ = await asyncio.wait_for(wire.read_frame(reader), 0.2)
                except asyncio.TimeoutError:
                    continue
                assert kind == wire.COMMIT
                beats.append(time.monotonic() - t0)
            # three heartbeats (0.5, 1.0, 1.5 s), a loaded machine may make it two; the serving task woke
            # for them and nothing else (it used to wake every 0.2 s: eight times here)
            assert 2 <= len(beats) <= 3, beats
            assert len(sends) <= len(beats) + 1, (sends, beats)
            gaps = [b - a for a, b in zip(beats, beats[1:])]
            assert all(gap >= node.ttl * HEARTBEAT_EVERY - 0.05 for gap in gaps), gaps
        finally:
            writer.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())


def test_no_heartbeat_while_the_member_is_heard_then_one_within_the_interval(leader_engine):
    """An ACK proves the member alive as a heartbeat's answer would: while ACKs come (chunks flowing), no
    heartbeat COMMIT goes out; once they stop, the next one is due an interval after the last ACK."""
    async def run():
        node = LeaderNode(leader_engine)
        node.ttl = 2.0                                 # a heartbeat every 0.5 s when nothing is heard
        st = node.leading["s"] = Leading(node, "s", 1, ["leader", "m1", "m2"])
        server, reader, writer = await _connect(node)
        try:
            t0 = time.monotonic()
            got = []

            async def read():
                while True:
                    got.append((await wire.read_frame(reader))[0])
            reading = asyncio.ensure_future(read())
            while time.monotonic() - t0 < 1.5:
                writer.write(wire.u64_frame(wire.ACK, 0))
                await asyncio.sleep(0.05)
            assert got == [], got                          # three intervals, nothing sent: it was heard
            last_ack = st.heard["m1"]
            while not got:
                await asyncio.sleep(0.01)
                assert time.monotonic() - last_ack < 2.0, "no heartbeat after the ACKs stopped"
            assert got == [wire.COMMIT]
            assert time.monotonic() - last_ack >= node.ttl * HEARTBEAT_EVERY - 0.05
            reading.cancel()
        finally:
            writer.close()
            server.close()
            await server.wait_closed()
    asyncio.run(run())


class _Node:
    """What pace.py and ``ClusterNode._cut_off`` read of a node."""

    def __init__(self, ttl=3.0):
        self.name = "a"
        self.ttl = ttl


class _St:
    def __init__(self, members, since, heard):
        self.members = members
        self.since = since
        self.heard = heard


def test_cut_off_at_is_the_first_moment_cut_off_is_true():
    rnd = random.Random(23)
    node = _Node()
    for _ in range(2000):
        members = ["a"] + [f"m{i}" for i in range(rnd.randrange(0, 5))]
        since = rnd.uniform(0, 10)
        heard = {m: rnd.uniform(since, since + 10) for m in members[1:] if rnd.random() < 0.8}
        st = _St(members, since, heard)
        due = pace.cut_off_at(node, st)
        if due == math.inf:
            assert not any(ClusterNode._cut_off(node, st, t) for t in (since, since + 100, since + 1e6))
            continue
        assert not ClusterNode._cut_off(node, st, due - 1e-6)
        assert ClusterNode._cut_off(node, st, due + 1e-9)      # (float rounding of heard + ttl - heard)
        assert ClusterNode._cut_off(node, st, due + rnd.uniform(0, 5))

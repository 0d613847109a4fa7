"""A leader killed between sending a chunk to its members and committing it itself (issue 23; the chunk is
sent ahead of the local commit by shells/cluster/leader_path.py).

The leader (n1) runs under die_after_send_ahead.py: after its fifth chunk sent ahead it waits for the
members to store it, then kills itself (SIGKILL) before its own commit. The publish of that chunk was never
confirmed. What must hold: the killed leader's log lacks it; a member holding it is elected and keeps it;
the publisher re-sends it with the same publishing id and the new leader drops it as a duplicate (its
publisher sequence reached the members with the chunk); the old leader, restarted, follows and ends with the
same log; every confirmed message is there exactly once, on all three nodes.
"""

import socket
import sys
import time
from pathlib import Path

import pytest

import rawwire
from clusterproc import Cluster
from riverbed.engine import Engine
from workload import body_of, read_log

pytestmark = pytest.mark.integration

DIE_AT = 5                     # the chunk sent ahead after which the leader dies
HERE = Path(__file__).resolve().parent
STREAM = "ahead"


def stream_of(st, name):
    return next((s for s in st["streams"] if s["name"] == name), None)


def records_on_disk(data_dir, stream):
    eng = Engine(data_dir, readonly=True)
    try:
        return [rec for _, rec in eng.scan(stream)]
    finally:
        eng.close()


def test_leader_killed_between_send_and_local_commit_loses_and_duplicates_nothing(tmp_path, etcd):
    c = Cluster(tmp_path, etcd, lease_ttl=1.0)
    n1 = c.nodes["n1"]
    n1.wrap = [sys.executable, str(HERE / "die_after_send_ahead.py")]
    n1.env = {"RIVERBED_TEST_DIE_AT_SEND_AHEAD": str(DIE_AT)}
    try:
        c.start()
        pub = rawwire.connect(n1.port)
        assert pub.create(STREAM, {"queue-leader-locator": "client-local"}) == rawwire.OK
        c.wait(lambda st: stream_of(st, STREAM) is not None and stream_of(st, STREAM)["leader"] == "n1" and all(
            m["committed_offset"] is not None for m in stream_of(st, STREAM)["members"]), what="the stream placed")
        assert pub.declare_publisher(1, STREAM, "pa") == rawwire.OK

        # one message at a time, each confirmed, until the leader dies mid-publish
        confirmed, lost_at = [], None
        for i in range(200):
            try:
                ok, bad = pub.publish_confirmed(1, [(i, body_of("pa", i))], timeout=15)
            except (ConnectionError, OSError, socket.timeout):
                lost_at = i
                break
            assert ok == {i} and not bad, (i, ok, bad)
            confirmed.append(i)
        pub.close()
        assert lost_at is not None, "the leader never died: no chunk was sent ahead of its commit"
        n1.proc.wait(10)
        assert n1.proc.returncode == -9, n1.log()
        assert "sent, not committed: dying" in n1.log()
        unconfirmed = body_of("pa", lost_at)

        # the killed leader never committed that chunk
        on_n1 = records_on_disk(n1.data_dir, STREAM)
        assert unconfirmed not in on_n1
        assert on_n1 == [body_of("pa", i) for i in confirmed]

        # a member that holds it leads now, and its committed log has it
        st = c.wait(lambda st: stream_of(st, STREAM)["leader"] in ("n2", "n3") and any(
            n["name"] == stream_of(st, STREAM)["leader"] and n["up"] for n in st["nodes"]), timeout=30,
            what="a new leader")
        leader = stream_of(st, STREAM)["leader"]
        port = c.nodes[leader].port
        deadline = time.monotonic() + 20
        while True:
            log = read_log(port, STREAM, settle=0.2)
            if unconfirmed in log or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert log == [body_of("pa", i) for i in confirmed] + [unconfirmed]

        # the publisher re-sends what was not confirmed, with the same id, then goes on
        pub = rawwire.connect(port)
        assert pub.declare_publisher(1, STREAM, "pa") == rawwire.OK
        ok, bad = pub.publish_confirmed(1, [(lost_at, unconfirmed)], timeout=15)
        assert ok == {lost_at} and not bad
        more = list(range(lost_at + 1, lost_at + 6))
        for i in more:
            ok, bad = pub.publish_confirmed(1, [(i, body_of("pa", i))], timeout=15)
            assert ok == {i} and not bad
        pub.close()

        # the old leader, back as an ordinary node, follows: one log everywhere, every message once
        c.restart("n1")
        want = [body_of("pa", i) for i in confirmed + [lost_at] + more]
        deadline = time.monotonic() + 30
        while True:
            logs = {name: read_log(srv.port, STREAM, settle=0.2) for name, srv in c.nodes.items()}
            if all(x == want for x in logs.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        for name, got in logs.items():
            assert got == want, f"{name}: {len(got)} records, want {len(want)}"
    finally:
        c.stop()


def test_one_message_confirms_wait_for_a_majority_also_when_the_first_member_stops(tmp_path, etcd):
    """The leader's one-message path (Broker.append_chunk_now with ``replicated``, issue 23's confirm
    latency) commits inline and holds the confirm: with both members stopped (SIGSTOP) a publish is not
    confirmed; once one of them runs again it is. When the member that gets each chunk first (the last
    majority-maker) stops, the other one still gets the chunk (BEHIND_WAIT; test_leader_feed.py times that
    exactly) and its ACK confirms it: one-at-a-time publishes go on, each in well under a second. At the end
    every node holds the same log."""
    import os
    import signal
    c = Cluster(tmp_path, etcd, lease_ttl=2.0)
    try:
        c.start()
        pub = rawwire.connect(c.nodes["n1"].port)
        assert pub.create(STREAM, {"queue-leader-locator": "client-local"}) == rawwire.OK
        c.wait(lambda st: stream_of(st, STREAM) is not None and stream_of(st, STREAM)["leader"] == "n1" and all(
            m["committed_offset"] is not None for m in stream_of(st, STREAM)["members"]), what="the stream placed")
        assert pub.declare_publisher(1, STREAM, "pm") == rawwire.OK
        i = 0
        for i in range(20):
            assert pub.publish_confirmed(1, [(i, body_of("pm", i))], timeout=10) == ({i}, {})
        pids = {name: c.nodes[name].pid for name in ("n2", "n3")}
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)
        try:
            i += 1
            pub.publish(1, [(i, body_of("pm", i))])
            with pytest.raises(socket.timeout):
                pub.wait_confirms({i}, timeout=0.6)      # no member holds it: no confirm (lease TTL 2 s)
            os.kill(pids["n3"], signal.SIGCONT)
            assert pub.wait_confirms({i}, timeout=10) == ([i], {})
            # n3's ACK made that majority: the next chunk goes ahead to n3 first. Stopped now, n2 back
            os.kill(pids["n3"], signal.SIGSTOP)
            os.kill(pids["n2"], signal.SIGCONT)
            for i in range(i + 1, i + 21):
                t0 = time.monotonic()
                assert pub.publish_confirmed(1, [(i, body_of("pm", i))], timeout=10) == ({i}, {})
                assert time.monotonic() - t0 < 0.9, "a confirm waited for the stopped member"
        finally:
            for pid in pids.values():
                os.kill(pid, signal.SIGCONT)
        pub.close()
        want = [body_of("pm", j) for j in range(i + 1)]
        deadline = time.monotonic() + 30
        while True:
            logs = {name: read_log(srv.port, STREAM, settle=0.2) for name, srv in c.nodes.items()}
            if all(x == want for x in logs.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        for name, got in logs.items():
            assert got == want, f"{name}: {len(got)} records, want {len(want)}"
    finally:
        c.stop()

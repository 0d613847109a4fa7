"""A stream on three real nodes joined through a real etcd (issue 23): membership, replication byte for
byte, confirms only once a majority holds a chunk, readers limited to the committed offset, failover."""

import os
import signal
import struct
import subprocess
import sys
import time

import pytest

import rawwire

pytestmark = pytest.mark.integration

KEY_SUBSCRIBE = 0x07
KEY_DELIVER = 0x08
OFFSET_FIRST = 1


def connect(port):
    c = rawwire.RawClient(port)
    assert c.handshake() == rawwire.OK
    return c


def stream_of(st, name):
    return next((s for s in st["streams"] if s["name"] == name), None)


def publish_batches(port, stream, first_id, n, batch=100, ref="", timeout=10.0):
    """Publish ``n`` messages (ids from ``first_id``) in batches; returns (confirmed ids, {id: error})."""
    c = connect(port)
    try:
        assert c.declare_publisher(1, stream, ref) == rawwire.OK
        confirmed, errors = set(), {}
        for start in range(first_id, first_id + n, batch):
            ids = range(start, min(start + batch, first_id + n))
            ok, bad = c.publish_confirmed(1, [(i, b"m-%d" % i) for i in ids], timeout=timeout)
            confirmed |= ok
            errors.update(bad)
        return confirmed, errors
    finally:
        c.close()



def dump(data_dir, stream):
    out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "dump", data_dir, "--stream", stream],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def chunk_lines(text, upto):
    """The chunk lines of a dump for chunks below offset ``upto``."""
    lines = []
    for line in text.splitlines():
        f = line.split()
        if f and f[0].isdigit() and int(f[0]) < upto:
            lines.append(line)
    return lines


def test_status_lists_the_nodes(cluster3):
    st = cluster3.status_cli()
    assert st["cluster"] == "test"
    assert sorted(n["name"] for n in st["nodes"]) == ["n1", "n2", "n3"]
    for n in st["nodes"]:
        assert n["up"] and n["stream_port"] == cluster3.nodes[n["name"]].port and n["replication_port"] > 0
        assert n["advertised_host"] == "127.0.0.1" and n["http_port"] == cluster3.nodes[n["name"]].ports["http"]
        assert n["leads"] == []


def test_replication_byte_identical_and_majority_confirms(cluster3):
    n1 = cluster3.nodes["n1"]
    c = connect(n1.port)
    assert c.create("orders") == rawwire.OK
    c.close()
    st = wait_placed(cluster3, "orders")
    s = stream_of(st, "orders")
    assert s["leader"] == "n1" and s["epoch"] == 1 and sorted(m["node"] for m in s["members"]) == ["n1", "n2", "n3"]
    confirmed, errors = publish_batches(n1.port, "orders", 0, 3000)
    assert errors == {} and len(confirmed) == 3000
    st = cluster3.wait(lambda st: all(m["committed_offset"] == 3000 and m["lag"] == 0
                                      for m in stream_of(st, "orders")["members"]), what="all members at 3000")
    # the leader's /metrics: each member's lag in records
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{n1.ports['http']}/metrics", timeout=10) as r:
        text = r.read().decode()
    for m in ("n2", "n3"):
        assert f'riverbed_replica_lag_records{{node="{m}",stream="orders"}} 0.0' in text, [x for x in text.splitlines() if 'replica' in x]
    # only the leader appends: a publish to a follower is forwarded to it (test_forward.py)
    confirmed, errors = publish_batches(cluster3.nodes["n2"].port, "orders", 5000, 10, batch=10)
    assert not errors and len(confirmed) == 10
    for srv in cluster3.nodes.values():
        srv.stop()
    dumps = {name: chunk_lines(dump(cluster3.data_dir(name), "orders"), 3000) for name in cluster3.nodes}
    assert len(dumps["n1"]) > 1
    assert dumps["n1"] == dumps["n2"] == dumps["n3"]


def wait_placed(cluster, stream):
    """Wait until ``stream`` is placed and every member holds its copy (reports a position)."""
    return cluster.wait(lambda st: stream_of(st, stream) is not None and all(
        m["committed_offset"] is not None for m in stream_of(st, stream)["members"]), what=f"{stream} placed")


def leader_of(cluster, stream, not_this=None, timeout=15):
    st = cluster.wait(lambda st: stream_of(st, stream) is not None and stream_of(st, stream)["leader"] != not_this
                      and any(n["up"] and n["name"] == stream_of(st, stream)["leader"] for n in st["nodes"]),
                      timeout=timeout, what=f"a leader of {stream} other than {not_this}")
    return stream_of(st, stream)["leader"]


def test_two_members_down_holds_confirms_then_one_back_resumes(tmp_path, etcd):
    from clusterproc import Cluster
    from rawwire import read_stream
    c = Cluster(tmp_path, etcd, extra=("--replication-timeout", "2"))
    try:
        c.start()
        n1 = c.nodes["n1"]
        cl = connect(n1.port)
        assert cl.create("events") == rawwire.OK
        cl.close()
        wait_placed(c, "events")
        confirmed, errors = publish_batches(n1.port, "events", 0, 200)
        assert len(confirmed) == 200 and not errors
        # one member down: a majority (two of three) still confirms
        c.nodes["n3"].kill()
        confirmed, errors = publish_batches(n1.port, "events", 200, 100)
        assert len(confirmed) == 100 and not errors
        # a replica serves consumers, up to the committed offset
        c.wait(lambda st: any(m["node"] == "n2" and m["committed_offset"] == 300
                              for m in stream_of(st, "events")["members"]), what="n2 at 300")
        assert read_stream(c.nodes["n2"].port, "events") == [b"m-%d" % i for i in range(300)]
        # two down: no majority, nothing is confirmed; the publish is refused (the leader resigns after
        # a lease TTL without a majority, or --replication-timeout passes)
        c.nodes["n2"].kill()
        t0 = time.monotonic()
        confirmed, errors = publish_batches(n1.port, "events", 300, 10, batch=10, timeout=10)
        assert not confirmed and len(errors) == 10
        assert time.monotonic() - t0 < 6
        # ... and no reader sees it: the leader's own consumers stop at the committed offset
        assert read_stream(n1.port, "events") == [b"m-%d" % i for i in range(300)]
        # one member back: a leader is elected among the two and confirms again
        c.restart("n2")
        leader = c.nodes[leader_of(c, "events", timeout=30)]
        confirmed, errors = publish_batches(leader.port, "events", 310, 10, batch=10, timeout=15)
        assert len(confirmed) == 10 and not errors
        seen = read_stream(leader.port, "events")
        assert seen[:300] == [b"m-%d" % i for i in range(300)] and seen[-10:] == [b"m-%d" % i for i in range(310, 320)]
    finally:
        c.stop()


def failover_round(c, stream, old, ref, next_id, confirmed):
    """kill -9 the leader ``old`` and publish until another node confirms; the failover time (s)."""
    c.nodes[old].kill()
    t0 = time.monotonic()
    pending = list(range(next_id, next_id + 50))
    while True:
        assert time.monotonic() - t0 < 30, "no new leader confirmed a publish within 30 s"
        leader = leader_of(c, stream, not_this=old, timeout=30)
        try:
            ok, errors = publish_batches(c.nodes[leader].port, stream, pending[0], len(pending), batch=50, ref=ref,
                                         timeout=5)
        except (ConnectionError, OSError, AssertionError):
            time.sleep(0.1)
            continue
        if ok:
            confirmed |= ok
            return time.monotonic() - t0
        time.sleep(0.1)


def test_kill_leader_new_leader_confirms_nothing_confirmed_lost(cluster3):
    from rawwire import read_stream
    n1 = cluster3.nodes["n1"]
    cl = connect(n1.port)
    assert cl.create("pay") == rawwire.OK
    cl.close()
    wait_placed(cluster3, "pay")
    confirmed, errors = publish_batches(n1.port, "pay", 0, 500, ref="p1")
    assert len(confirmed) == 500 and not errors
    took = failover_round(cluster3, "pay", "n1", "p1", 500, confirmed)
    assert took < 5, f"failover took {took:.2f} s"
    new = leader_of(cluster3, "pay", not_this="n1")
    st = cluster3.status()
    assert stream_of(st, "pay")["epoch"] >= 2
    seen = read_stream(cluster3.nodes[new].port, "pay")
    ids = [int(m.split(b"-")[1]) for m in seen]
    assert set(ids) >= confirmed, "a confirmed message was lost"
    assert len(ids) == len(set(ids)), "a message was stored twice"
    # the killed leader comes back as a member and copies the new leader's log
    cluster3.restart("n1")
    cluster3.wait(lambda st: all(m["lag"] == 0 and m["committed_offset"] == len(ids)
                                 for m in stream_of(st, "pay")["members"]), what="n1 caught up")
    assert read_stream(cluster3.nodes["n1"].port, "pay") == seen
    print(f"failover time {took:.2f} s")


def test_metadata_names_leader_and_replicas_rstream_publishes_through_a_member(cluster3):
    """rstream, bootstrapped on a member, is sent to the leader by Metadata and publishes there; a
    consumer reads the replicated records."""
    import asyncio

    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

    ports = {name: srv.port for name, srv in cluster3.nodes.items()}
    n1 = cluster3.nodes["n1"]
    cl = connect(n1.port)
    assert cl.create("meta") == rawwire.OK
    cl.close()
    wait_placed(cluster3, "meta")

    async def go():
        confirmed = set()
        done = asyncio.Event()

        def on_confirm(status):
            if status.is_confirmed:
                confirmed.add(status.message_id)
            if len(confirmed) >= 1000:
                done.set()
        async with Producer("127.0.0.1", ports["n2"], username="guest", password="guest") as p:
            for start in range(0, 1000, 100):
                await p.send_batch("meta", [b"r-%d" % i for i in range(start, start + 100)],
                                   on_publish_confirm=on_confirm)
            await asyncio.wait_for(done.wait(), 30)
        got = []
        enough = asyncio.Event()

        async def on_message(msg, ctx):
            got.append(bytes(msg))
            if len(got) >= 1000:
                enough.set()
        async with Consumer("127.0.0.1", ports["n3"], username="guest", password="guest") as c:
            await c.start()
            await c.subscribe("meta", on_message, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
            await asyncio.wait_for(enough.wait(), 30)
        return confirmed, got
    confirmed, got = asyncio.run(asyncio.wait_for(go(), 90))
    assert len(confirmed) == 1000
    assert got[:1000] == [b"r-%d" % i for i in range(1000)]


def test_metadata_frame(cluster3):
    n1, n2 = cluster3.nodes["n1"], cluster3.nodes["n2"]
    cl = connect(n1.port)
    assert cl.create("md") == rawwire.OK
    cl.close()
    wait_placed(cluster3, "md")
    c = connect(n2.port)
    try:
        corr = c.next_corr()
        c.send(rawwire.frame(0x0F, struct.pack(">Ii", corr, 1) + rawwire.s("md")))
        body = c.wait_for(0x800F)
    finally:
        c.close()
    pos = 4
    (nb,) = struct.unpack_from(">i", body, pos)
    pos += 4
    brokers = {}
    for _ in range(nb):
        ref, hl = struct.unpack_from(">HH", body, pos)
        host = body[pos + 4:pos + 4 + hl].decode()
        (port,) = struct.unpack_from(">I", body, pos + 4 + hl)
        brokers[ref] = (host, port)
        pos += 8 + hl
    pos += 4
    (sl,) = struct.unpack_from(">H", body, pos)
    assert body[pos + 2:pos + 2 + sl] == b"md"
    pos += 2 + sl
    code, leader, nrep = struct.unpack_from(">HHi", body, pos)
    replicas = struct.unpack_from(">%dH" % nrep, body, pos + 8)
    assert code == 1 and brokers[leader] == ("127.0.0.1", n1.port)
    assert sorted(brokers[r][1] for r in replicas) == sorted([n2.port, cluster3.nodes["n3"].port])


def test_sigstop_leader_rejoins_as_member_and_keeps_what_it_confirmed(cluster3):
    from rawwire import read_stream
    n1 = cluster3.nodes["n1"]
    cl = connect(n1.port)
    assert cl.create("halt") == rawwire.OK
    cl.close()
    wait_placed(cluster3, "halt")
    confirmed, errors = publish_batches(n1.port, "halt", 0, 300, ref="p")
    assert len(confirmed) == 300 and not errors
    # a second publisher on n1 whose publishes reach it while it is paused: whatever n1 confirms of them
    # after SIGCONT must be in the final log (it should confirm none: its lease is gone)
    held = connect(n1.port)
    assert held.declare_publisher(1, "halt", "q") == rawwire.OK
    os.kill(n1.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        held.publish(1, [(i, b"q-%d" % i) for i in range(20)])
        new = leader_of(cluster3, "halt", not_this="n1", timeout=30)
        elected = time.monotonic() - t0
        ok, errors = publish_batches(cluster3.nodes[new].port, "halt", 300, 100, ref="p")
        took = time.monotonic() - t0
        assert len(ok) == 100 and not errors
        confirmed |= ok
        time.sleep(max(0.0, 2 * cluster3.lease_ttl - took))
    finally:
        os.kill(n1.pid, signal.SIGCONT)
    held_ok, held_refused = set(), {}
    deadline = time.monotonic() + 15
    while len(held_ok) + len(held_refused) < 20 and time.monotonic() < deadline:
        try:
            f = held.recv_frame(max(0.01, deadline - time.monotonic()))
        except OSError:
            break
        if f is None:
            break
        k, _, body = f
        n = struct.unpack_from(">i", body, 1)[0] if k in (0x03, 0x04) else 0
        if k == 0x03:
            held_ok.update(struct.unpack_from(">%dQ" % n, body, 5))
        elif k == 0x04:
            held_refused.update(struct.unpack_from(">QH", body, 5 + 10 * j) for j in range(n))
    held.close()
    # the paused node finds its lease gone, steps down and follows the new leader
    st = cluster3.wait(lambda st: stream_of(st, "halt")["leader"] == new and all(
        m["lag"] == 0 and m["committed_offset"] == 400 for m in stream_of(st, "halt")["members"]),
        timeout=30, what="n1 following the new leader")
    assert stream_of(st, "halt")["epoch"] >= 2
    ok, errors = publish_batches(n1.port, "halt", 1000, 10, batch=10)
    assert len(ok) == 10 and not errors           # no longer the leader: forwarded to the new one
    confirmed |= ok
    cluster3.wait(lambda st: all(m["committed_offset"] == 410 for m in stream_of(st, "halt")["members"]),
                  what="every member at 410")
    seen = read_stream(n1.port, "halt")
    assert [int(m.split(b"-")[1]) for m in seen if m.startswith(b"m-")] == sorted(confirmed)
    assert {b"q-%d" % i for i in held_ok} <= set(seen), "n1 confirmed, after SIGCONT, what the log lacks"
    assert read_stream(cluster3.nodes[new].port, "halt") == seen
    print(f"SIGSTOP: {new} elected after {elected:.2f} s, confirmed {took:.2f} s after the pause; the paused "
          f"leader confirmed {len(held_ok)} and refused {len(held_refused)} of 20 publishes it got while paused")


def test_delete_removes_the_stream_from_every_member_also_one_that_was_down(cluster3):
    n1 = cluster3.nodes["n1"]
    cl = connect(n1.port)
    assert cl.create("gone") == rawwire.OK
    cl.close()
    wait_placed(cluster3, "gone")
    confirmed, _ = publish_batches(n1.port, "gone", 0, 100)
    assert len(confirmed) == 100
    cluster3.wait(lambda st: all(m["lag"] == 0 and m["committed_offset"] == 100
                                 for m in stream_of(st, "gone")["members"]), what="all members at 100")
    cluster3.nodes["n3"].kill()                    # away while the stream is deleted
    cl = connect(n1.port)
    assert cl.delete("gone") == rawwire.OK
    cl.close()
    cluster3.wait(lambda st: stream_of(st, "gone") is None, what="the placement gone")

    def has(name, port):
        c = connect(port)
        try:
            code, _ = c.request(0x1C, rawwire.s("gone"))     # StreamStats: 0x02 when it does not exist
            return code == rawwire.OK
        finally:
            c.close()
    deadline = time.monotonic() + 10
    while has("n2", cluster3.nodes["n2"].port):
        assert time.monotonic() < deadline, "n2 still has the deleted stream"
        time.sleep(0.1)
    n3 = cluster3.restart("n3")
    deadline = time.monotonic() + 10
    while has("n3", n3.port):
        assert time.monotonic() < deadline, "n3 brought the deleted stream back"
        time.sleep(0.1)
    time.sleep(1)
    assert stream_of(cluster3.status(), "gone") is None      # nobody placed it again


def test_consumer_offsets_reach_the_members(cluster3):
    n1, n2 = cluster3.nodes["n1"], cluster3.nodes["n2"]
    cl = connect(n1.port)
    assert cl.create("offs") == rawwire.OK
    wait_placed(cluster3, "offs")
    confirmed, _ = publish_batches(n1.port, "offs", 0, 50)
    assert len(confirmed) == 50
    cl.send(rawwire.frame(0x0A, struct.pack(">H", 2) + b"c1" + rawwire.s("offs") + struct.pack(">Q", 41)))
    cl.close()
    c2 = connect(n2.port)
    try:
        deadline = time.monotonic() + 10
        while True:
            code, rest = c2.request(0x0B, rawwire.s("c1") + rawwire.s("offs"))
            if code == rawwire.OK and struct.unpack_from(">Q", rest)[0] == 41:
                break
            assert time.monotonic() < deadline, f"n2 never got the stored offset ({code}, {rest!r})"
            time.sleep(0.1)
    finally:
        c2.close()


def test_partition_leader_from_both_members_minority_confirms_nothing(tmp_path, etcd):
    """The leader's replication port is cut off from both members (a proxy in front of it; etcd stays
    reachable): the leader confirms nothing, resigns after a lease TTL, the two members elect one of
    them, which confirms; the old leader then follows it and drops what it never confirmed."""
    from clusterproc import Cluster
    from tcpproxy import CuttableProxy
    from rawwire import read_stream
    proxy = CuttableProxy()
    c = Cluster(tmp_path, etcd, extra=("--replication-timeout", "3"),
                node_extra={"n1": ("--advertised-replication-port", str(proxy.port))})
    try:
        c.start()
        proxy.target = c.nodes["n1"].ports["replication"]
        n1 = c.nodes["n1"]
        cl = connect(n1.port)
        assert cl.create("split") == rawwire.OK
        cl.close()
        wait_placed(c, "split")
        confirmed, errors = publish_batches(n1.port, "split", 0, 100, ref="p")
        assert len(confirmed) == 100 and not errors
        proxy.cut()
        ok, errors = publish_batches(n1.port, "split", 100, 10, batch=10, ref="p", timeout=10)
        assert not ok and len(errors) == 10          # the minority side confirms nothing
        new = leader_of(c, "split", not_this="n1", timeout=30)
        ok, errors = publish_batches(c.nodes[new].port, "split", 200, 50, ref="p")
        assert len(ok) == 50 and not errors
        confirmed |= ok
        want = [b"m-%d" % i for i in sorted(confirmed)]
        assert read_stream(c.nodes[new].port, "split") == want
        # the old leader follows the new one (it dials it directly) and holds the same log
        c.wait(lambda st: all(m["lag"] == 0 and m["committed_offset"] == 150
                              for m in stream_of(st, "split")["members"]), timeout=30, what="n1 following")
        assert read_stream(n1.port, "split") == want
    finally:
        c.stop()
        proxy.close()


def test_initial_cluster_size_argument(cluster3):
    n2 = cluster3.nodes["n2"]
    cl = connect(n2.port)
    local = {"queue-leader-locator": "client-local"}      # else the second is led by a node leading none
    assert cl.create("pair", {"initial-cluster-size": "2", **local}) == rawwire.OK
    assert cl.create("solo", {"x-initial-cluster-size": "1", **local}) == rawwire.OK
    cl.close()
    st = wait_placed(cluster3, "pair")
    st = wait_placed(cluster3, "solo")
    pair, solo = stream_of(st, "pair"), stream_of(st, "solo")
    assert pair["leader"] == "n2" and len(pair["members"]) == 2 and pair["members"][0]["node"] == "n2"
    assert solo["leader"] == "n2" and [m["node"] for m in solo["members"]] == ["n2"]
    confirmed, errors = publish_batches(n2.port, "pair", 0, 100)
    assert len(confirmed) == 100 and not errors
    confirmed, errors = publish_batches(n2.port, "solo", 0, 100)
    assert len(confirmed) == 100 and not errors


@pytest.mark.slow
def test_100k_messages_byte_identical_and_consumed_from_a_replica(cluster3):
    """The issue's replication check: 100k messages through one node, byte-identical on all three data
    directories up to the committed offset (riverbed dump agrees), and rstream consumes them from a
    replica."""
    import asyncio

    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType
    n1 = cluster3.nodes["n1"]
    cl = connect(n1.port)
    assert cl.create("big") == rawwire.OK
    cl.close()
    wait_placed(cluster3, "big")
    t0 = time.monotonic()
    confirmed, errors = publish_batches(n1.port, "big", 0, 100_000, batch=1000, timeout=30)
    took = time.monotonic() - t0
    assert len(confirmed) == 100_000 and not errors
    cluster3.wait(lambda st: all(m["committed_offset"] == 100_000 and m["lag"] == 0
                                 for m in stream_of(st, "big")["members"]), timeout=60, what="all at 100k")

    async def consume(port):
        got = []
        done = asyncio.Event()

        async def on_message(msg, ctx):
            got.append(bytes(msg))
            if len(got) >= 100_000:
                done.set()
        async with Consumer("127.0.0.1", port, username="guest", password="guest") as c:
            await c.start()
            await c.subscribe("big", on_message,
                              offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
            await asyncio.wait_for(done.wait(), 120)
        return got
    got = asyncio.run(consume(cluster3.nodes["n3"].port))
    assert got == [b"m-%d" % i for i in range(100_000)]
    for srv in cluster3.nodes.values():
        srv.stop()
    dumps = {name: chunk_lines(dump(cluster3.data_dir(name), "big"), 100_000) for name in cluster3.nodes}
    assert len(dumps["n1"]) >= 100 and dumps["n1"] == dumps["n2"] == dumps["n3"]
    print(f"100k replicated publishes (batches of 1000, confirmed) in {took:.1f} s; "
          f"{len(dumps['n1'])} chunks identical on 3 nodes")


def test_etcd_restart_nothing_fails_over_committed_stays_readable(cluster3):
    """etcd stops: no failover happens, committed records stay readable, the leader stops confirming
    once its lease could have expired; etcd returns: the stream has a leader and confirms again."""
    from rawwire import read_stream
    n1 = cluster3.nodes["n1"]
    cl = connect(n1.port)
    assert cl.create("calm") == rawwire.OK
    cl.close()
    wait_placed(cluster3, "calm")
    confirmed, errors = publish_batches(n1.port, "calm", 0, 100, ref="p")
    assert len(confirmed) == 100 and not errors
    cluster3.etcd.stop()
    try:
        time.sleep(2 * cluster3.lease_ttl)
        want = [b"m-%d" % i for i in range(100)]
        assert read_stream(n1.port, "calm") == want
        assert read_stream(cluster3.nodes["n2"].port, "calm") == want
        ok, errors = publish_batches(n1.port, "calm", 100, 10, batch=10, ref="p", timeout=15)
        assert not ok and len(errors) == 10        # no lease: no confirm
    finally:
        cluster3.etcd.start()
    back = time.monotonic()
    deadline = back + 30
    while True:
        leader = leader_of(cluster3, "calm", timeout=30)
        ok, errors = publish_batches(cluster3.nodes[leader].port, "calm", 100, 10, batch=10, ref="p",
                                     timeout=10)
        if ok:
            break
        assert time.monotonic() < deadline, f"no confirm after etcd returned: {errors}"
        time.sleep(0.2)
    print(f"\nfirst confirm {time.monotonic() - back:.2f} s after etcd was back (lease TTL {cluster3.lease_ttl} s)")
    seen = read_stream(cluster3.nodes[leader].port, "calm")
    assert seen[:100] == [b"m-%d" % i for i in range(100)]

"""Compaction of the document changelog on three real nodes (shells/cluster/compaction.py): snapshots every
few records while writes go on, the changelog leader killed -9 in the middle of them, every node's copy
trimmed, and a node whose data dir is wiped loading the snapshot: every acknowledged write is on every
node, in one state, and unique keys are decided there as everywhere."""

import json
import shutil
import threading
import time

import pytest

from clusterproc import Cluster
from test_docstore import CHANGELOG, LISTENERS, Ream, agg_get, eventually, leader_of, select, sized

from riverbed.engine import Engine

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EVERY = 30          # --docs-snapshot-every: a snapshot every 30 changelog records
PAD = "x" * 100_000  # documents big enough that a snapshot (5 MB) is many parts and takes a while


@pytest.fixture
def docs3(tmp_path, etcd):
    c = Cluster(tmp_path, etcd, extra=(*LISTENERS, "--docs-snapshot-every", str(EVERY)))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def first_chunk(c, node):
    eng = Engine(c.data_dir(node), readonly=True)
    try:
        return eng.stream_info(CHANGELOG).first_chunk_id
    finally:
        eng.close()


class Writer(threading.Thread):
    """AGGREGATE SETs of ``carts`` ids 0..49 through ``node`` until stopped: ``acked`` holds the last
    acknowledged value of each id; a refusal or a dropped connection is retried with the same value."""

    def __init__(self, c, node):
        super().__init__(daemon=True)
        self.c, self.node = c, node
        self.acked = {}
        self.n = 0
        self.stop = threading.Event()
        self.errors = 0

    def run(self):
        r = None
        while not self.stop.is_set():
            doc_id, value = self.n % 50, {"n": self.n, "pad": PAD}
            try:
                if r is None:
                    r = Ream(self.c.nodes[self.node].ports["ream"], timeout=15)
                line = r.request(sized(f"AGGREGATE SET carts {doc_id}", json.dumps(value)))[0]
            except (OSError, EOFError):
                r = None
                self.errors += 1
                time.sleep(0.1)
                continue
            if line == f"AGGREGATE SET DONE carts {doc_id}":
                self.acked[doc_id] = value
                self.n += 1
            else:
                self.errors += 1
                time.sleep(0.1)
        if r is not None:
            r.close()


def test_compaction_under_writes_and_a_kill_loses_nothing_and_a_wiped_node_loads_the_snapshot(docs3):
    c = docs3
    w = Ream(c.nodes["n1"].ports["ream"])
    assert w.request(b"PROJECTION CREATE people 3 +name +email *city\n")[0] == "PROJECTION CREATED people"
    people = []
    for i in range(20):
        row = {"name": f"p{i:02}", "email": f"{i}@x", "city": ["Oslo", "Rome"][i % 2]}
        assert w.request(sized("PROJECTION SET people", json.dumps(row)))[0] == f'PROJECTION SET DONE people "p{i:02}"'
        people.append(row)
    w.close()
    leader = leader_of(c, CHANGELOG)
    assert leader == "n1"

    # writes through n2 go on while snapshots are taken; the changelog's leader is killed -9 among them
    writer = Writer(c, "n2")
    writer.start()
    eventually(lambda: writer.n >= 4 * EVERY, timeout=60, what="writes before the kill")
    old = c.nodes["n1"]
    taking = lambda: [ln.split("snapshot ")[1].split()[0] for ln in old.lines if "taking document snapshot" in ln]  # noqa: E731
    before = len(taking())
    deadline = time.monotonic() + 30
    while len(taking()) == before and time.monotonic() < deadline:
        time.sleep(0.001)
    old.kill()          # kill -9 as the snapshot is being appended
    token = taking()[-1]
    mid = not any(f"document snapshot {token} at" in ln and "collections" in ln for ln in old.lines)
    print(f"killed n1 {'during' if mid else 'just after'} snapshot {token}")
    new = leader_of(c, CHANGELOG, not_this="n1")
    at_kill = writer.n
    eventually(lambda: writer.n >= at_kill + 4 * EVERY, timeout=60, what="writes after the kill")
    c.restart("n1")
    eventually(lambda: writer.n >= at_kill + 6 * EVERY, timeout=60, what="writes after the restart")
    writer.stop.set()
    writer.join(30)
    acked = dict(writer.acked)
    assert len(acked) == 50

    # every node's copy dropped its head once a whole snapshot covered it
    for node in ("n1", "n2", "n3"):
        assert eventually(lambda: first_chunk(c, node) > 0, timeout=20, what=f"{node}'s trimmed changelog")

    # a node wiped and restarted (not the leader) copies the log from the leader's first chunk on and
    # loads the snapshot
    wiped = "n3" if new != "n3" else "n1"
    c.nodes[wiped].kill()
    shutil.rmtree(c.data_dir(wiped))
    srv = c.restart(wiped)
    assert eventually(lambda: any("loaded the document snapshot" in ln for ln in srv.lines), timeout=30,
                      what="the snapshot load")

    for node in ("n1", "n2", "n3"):
        for doc_id in (0, 17, 49):
            assert eventually(lambda: agg_get(c, node, "carts", doc_id) == acked[doc_id], timeout=20,
                              what=f"carts {doc_id} on {node}")
        assert eventually(lambda: select(c, node, "people") == people, timeout=20)
    # the whole state, on every node alike
    r = {node: Ream(c.nodes[node].ports["ream"]) for node in ("n1", "n2", "n3")}
    try:
        for doc_id, value in acked.items():
            for node in r:
                line, payload = r[node].request(f"AGGREGATE GET carts {doc_id}\n".encode())
                assert json.loads(payload) == value, (node, doc_id)
        # the unique index came with the snapshot: the wiped node refuses a taken email
        line = r[wiped].request(sized("PROJECTION SET people", json.dumps(
            {"name": "zz", "email": "3@x", "city": "Oslo"})))[0]
        assert line.startswith('PROJECTION NON SET people "Unique constraint violated'), line
        line = r[wiped].request(sized("PROJECTION SET people", json.dumps(
            {"name": "zz", "email": "new@x", "city": "Oslo"})))[0]
        assert line == 'PROJECTION SET DONE people "zz"', line
    finally:
        for x in r.values():
            x.close()
    for node in ("n1", "n2", "n3"):
        assert eventually(lambda: len(select(c, node, "people")) == 21, timeout=20)

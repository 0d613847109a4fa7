"""The cluster in ``GET /api/cluster`` and on the dashboard (real etcd, three nodes): nodes up/down with
their addresses, a stream's leader and members, and a replica's lag rising while it is paused
(SIGSTOP) and falling back to 0 once it runs again (SIGCONT). The dashboard part runs headless
Chromium as tests/integration/test_http_dashboard.py does."""

import json
import os
import signal
import struct
import threading
import time
import urllib.request

import pytest

import rawwire
from chromium import browser, open_page  # noqa: F401  (browser: a fixture)

pytestmark = pytest.mark.integration

STREAM = "view-orders"
# A member is paused until its lag has been seen, for PAUSE_MAX seconds at most. It keeps its lease (and
# stays up, its position reported) that long: keepalives go every TTL/4, so the lease lasts >= 0.75 TTL.
# The lag shows within a poll (0.25 s) after the member has been silent for view.BEHIND_AFTER (the leader
# then reports its log's end at once), plus a read of the view (view.CACHE_TTL) and, on the dashboard, a
# snapshot interval: about 2.3 s at most on an idle machine, so PAUSE_MAX leaves room for a loaded one.
LEASE_TTL = 8.0
PAUSE_MAX = 5.0
SEEN_FOR = 0.6           # seconds the member stays paused once its lag shows (a few more samples)


def get(srv, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['http']}{path}", timeout=10) as r:
        return json.loads(r.read())


def stream_of(doc, name):
    return next((s for s in doc["streams"] if s["name"] == name), None)


def start_cluster(tmp_path, etcd, threaded=False):
    """Three nodes with a LEASE_TTL lease. ``threaded``: status reads run on their own thread, for a test
    whose thread has Playwright's event loop running (asyncio.run cannot nest in it)."""
    from clusterproc import Cluster

    class ThreadedCluster(Cluster):
        def status(self):
            out = []
            t = threading.Thread(target=lambda: out.append(Cluster.status(self)))
            t.start()
            t.join(30)
            return out[0]
    return (ThreadedCluster if threaded else Cluster)(tmp_path, etcd, lease_ttl=LEASE_TTL).start()


def create_placed(cluster):
    c = rawwire.RawClient(cluster.nodes["n1"].port)
    assert c.handshake() == rawwire.OK and c.create(STREAM) == rawwire.OK
    c.close()
    st = cluster.wait(lambda st: stream_of(st, STREAM) is not None and all(
        m["committed_offset"] is not None for m in stream_of(st, STREAM)["members"]), what="placed")
    return stream_of(st, STREAM)["leader"]


class Publisher(threading.Thread):
    """Publishes batches of 200 confirmed messages to the leader until stopped."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.confirmed = 0
        self.error = None

    def run(self):
        try:
            c = rawwire.RawClient(self.port, timeout=30)
            assert c.handshake() == rawwire.OK and c.declare_publisher(1, STREAM) == rawwire.OK
            i = 0
            while not self.stop.is_set():
                ok, bad = c.publish_confirmed(1, [(i + k, b"m-%d" % (i + k)) for k in range(200)], timeout=20)
                assert not bad, bad
                self.confirmed += len(ok)
                i += 200
                time.sleep(0.05)
            c.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def forward_some(srv, n):
    """Publish ``n`` confirmed messages through ``srv``, which does not lead STREAM (forwarded)."""
    c = rawwire.RawClient(srv.port, timeout=30)
    try:
        assert c.handshake() == rawwire.OK and c.declare_publisher(7, STREAM, "fwd") == rawwire.OK
        ok, bad = c.publish_confirmed(7, [(i, b"f-%d" % i) for i in range(n)], timeout=20)
        assert len(ok) == n and not bad, bad
    finally:
        c.close()
    time.sleep(view_cache_ttl())


def view_cache_ttl():
    from riverbed.shells.cluster.view import CACHE_TTL
    return CACHE_TTL + 0.1


def lag_of(doc, node):
    s = stream_of(doc, STREAM)
    return next(m["lag"] for m in s["members"] if m["node"] == node) if s else None


def pause_and_watch(cluster, leader, paused, sample):
    """Publish through the leader, SIGSTOP ``paused`` until ``sample()`` (the lag of ``paused`` as some
    view shows it) has been above 0, and above what it showed before the pause, for SEEN_FOR s (or for
    PAUSE_MAX s), then SIGCONT. Returns (lags while paused, lags after, publisher)."""
    pub = Publisher(cluster.nodes[leader].port)
    pub.start()
    pid = cluster.nodes[paused].proc.pid
    during, after = [], []
    try:
        time.sleep(0.5)
        before = sample() or 0     # positions are reported at intervals: a running member may show some lag
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        seen = None
        try:
            while time.monotonic() < t0 + PAUSE_MAX and (seen is None or time.monotonic() < seen + SEEN_FOR):
                during.append(sample())
                if seen is None and (during[-1] or 0) > before:
                    seen = time.monotonic()
                time.sleep(0.2)
        finally:
            os.kill(pid, signal.SIGCONT)
        print(f"lag first seen {seen - t0:.2f} s after SIGSTOP" if seen else "lag not seen while paused")
        pub.stop.set()
        pub.join(30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            after.append(sample())
            if after[-1] == 0:
                break
            time.sleep(0.2)
    finally:
        pub.stop.set()
        os.kill(pid, signal.SIGCONT)
    assert pub.error is None, pub.error
    print(f"lag of {paused} before: {before}; while paused: {during}; after SIGCONT: {after}; "
          f"{pub.confirmed} confirmed")
    return during, after, pub


def test_api_cluster_shows_nodes_leader_members_and_lag(tmp_path, etcd):
    cluster = start_cluster(tmp_path, etcd)
    try:
        leader = create_placed(cluster)
        replicas = sorted(n for n in cluster.nodes if n != leader)
        # every node answers the same document: three nodes up with their addresses, the stream's leader
        # and members; it is `riverbed cluster status --json`'s, plus the node that answers
        status = cluster.status_cli()
        for name, srv in cluster.nodes.items():
            doc = get(srv, "/api/cluster")
            assert doc["cluster"] == "test" and doc["self"] == name
            assert doc["nodes"] == status["nodes"]
            s = stream_of(doc, STREAM)
            assert s["leader"] == leader and sorted(m["node"] for m in s["members"]) == ["n1", "n2", "n3"]
            for n in doc["nodes"]:
                assert n["up"] and n["stream_port"] == cluster.nodes[n["name"]].port
                assert n["http_port"] == cluster.nodes[n["name"]].ports["http"]
            assert isinstance(doc["forwarded"], dict)
        # a replica paused: its lag (as the other replica's node reports it) rises, then falls to 0
        paused, viewer = replicas[0], cluster.nodes[replicas[1]]
        during, after, pub = pause_and_watch(cluster, leader, paused, lambda: lag_of(get(viewer, "/api/cluster"), paused))
        assert pub.confirmed > 0
        assert max(x or 0 for x in during) > 0, during
        assert during[-1] >= during[0], during
        assert after[-1] == 0, after
        # the leader's /metrics agrees once caught up (the same positions, the one other source)
        want = f'riverbed_replica_lag_records{{node="{paused}",stream="{STREAM}"}} 0.0'
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{cluster.nodes[leader].ports['http']}/metrics",
                                        timeout=10) as r:
                text = r.read().decode()
            if want in text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert want in text, [x for x in text.splitlines() if "replica_lag" in x]
        # the dashboard's snapshot carries the same view
        with urllib.request.urlopen(f"http://127.0.0.1:{viewer.ports['http']}/api/events", timeout=10) as r:
            snap = None
            for line in r:
                if line.startswith(b"data: "):
                    snap = json.loads(line[6:])
                    break
        assert snap["cluster"]["self"] == replicas[1] and stream_of(snap["cluster"], STREAM)["leader"] == leader
        # a publish through the viewer (a replica) is forwarded to the leader: the viewer counts it
        assert STREAM not in get(viewer, "/api/cluster")["forwarded"]
        forward_some(viewer, 50)
        assert get(viewer, "/api/cluster")["forwarded"][STREAM] == 50
        # a node down: shown down by the others
        cluster.nodes[paused].kill()
        doc = get(viewer, "/api/cluster")
        deadline = time.monotonic() + 3 * LEASE_TTL + 5
        while time.monotonic() < deadline and next(n for n in doc["nodes"] if n["name"] == paused)["up"]:
            time.sleep(0.3)
            doc = get(viewer, "/api/cluster")
        assert next(n for n in doc["nodes"] if n["name"] == paused)["up"] is False
    finally:
        cluster.stop()


def test_api_cluster_on_a_lone_node(tmp_path):
    from procs import ServerProcess
    srv = ServerProcess(tmp_path / "d", "--http-port", "0").start()
    try:
        assert get(srv, "/api/cluster") == {"cluster": None, "self": None, "nodes": [], "streams": [],
                                            "forwarded": {}}
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------ the dashboard

TIMEOUT_MS = 20_000


@pytest.mark.slow
def test_dashboard_shows_the_cluster_and_a_paused_replicas_lag(tmp_path, etcd, browser):
    cluster = start_cluster(tmp_path, etcd, threaded=True)
    problems = []
    try:
        leader = create_placed(cluster)
        replicas = sorted(n for n in cluster.nodes if n != leader)
        viewer = cluster.nodes[replicas[1]]
        ctx, page = open_page(browser, f"http://127.0.0.1:{viewer.ports['http']}/", problems, height=1200,
                              failed_requests=False)
        page.wait_for_selector("#cluster-panel:not([hidden])", timeout=TIMEOUT_MS)
        # three nodes, all up, with their stream ports
        page.wait_for_function("() => document.querySelectorAll('#nodes tbody tr.up').length === 3",
                               timeout=TIMEOUT_MS)
        for name, srv in cluster.nodes.items():
            row = page.locator(f'#nodes tbody tr[data-node="{name}"]')
            assert row.locator(".node-state").inner_text() == "up"
            assert str(srv.port) in row.inner_text()
        assert page.locator("#cluster-self").inner_text() == replicas[1]
        # the stream's leader and its three members
        row = page.locator(f'#placement tbody tr[data-stream="{STREAM}"]')
        row.wait_for(timeout=TIMEOUT_MS)
        assert row.locator("td.leader").inner_text() == leader
        assert sorted(row.locator(".member").evaluate_all("els => els.map(e => e.dataset.node)")) == ["n1", "n2", "n3"]
        page.wait_for_function(
            "([n, s]) => (document.querySelector(`#nodes tbody tr[data-node=\"${n}\"] td.leads`) || {}).textContent === s",
            arg=[leader, STREAM], timeout=TIMEOUT_MS)

        paused = replicas[0]
        cell = f'#placement tbody tr[data-stream="{STREAM}"] .member[data-node="{paused}"]'

        def shown_lag():
            v = page.locator(cell).get_attribute("data-lag")
            return int(v) if v not in (None, "") else None

        during, after, _ = pause_and_watch(cluster, leader, paused, shown_lag)
        assert max(x or 0 for x in during) > 0, during
        assert after[-1] == 0, after
        assert max(x or 0 for x in during) > (after[-1] or 0)
        # publishes forwarded by the viewer to the leader show in its column
        forward_some(viewer, 50)
        page.wait_for_function(
            "s => (document.querySelector(`#placement tr[data-stream=\"${s}\"] td.forwarded`) || {}).textContent === '50'",
            arg=STREAM, timeout=TIMEOUT_MS)
        ctx.close()
    finally:
        cluster.stop()
    assert problems == []

"""``riverbed streams``, ``publish`` and ``tail`` pointed at a node that does not lead the stream (real etcd,
three nodes): creation and deletion go through etcd placement and reach every node; publish lands on
the leader (rstream's producer asks Metadata for it); tail reads from a replica."""

import json
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "riverbed.shells.cli"]


def rb(srv, *args, input=None, timeout=60):
    """Run ``riverbed ARGS --uri <srv>``; returns the CompletedProcess (text)."""
    return subprocess.run([*CLI, *args, "--uri", f"rabbitmq-stream://guest:guest@127.0.0.1:{srv.port}"],
                          input=input, capture_output=True, text=True, timeout=timeout)


def ok(srv, *args, **kw):
    r = rb(srv, *args, **kw)
    assert r.returncode == 0, (args, r.returncode, r.stdout, r.stderr)
    return r


def stream_of(st, name):
    return next((s for s in st["streams"] if s["name"] == name), None)


def names_on(srv):
    return [s["name"] for s in json.loads(ok(srv, "streams", "ls", "--json").stdout)]


def consumers_on(srv, stream):
    url = f"http://127.0.0.1:{srv.ports['http']}/api/stream/consumers?stream={stream}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return []


def test_streams_publish_tail_against_non_leaders(cluster3):
    nodes = cluster3.nodes
    # create through n2: placed in etcd, a copy on every node
    ok(nodes["n2"], "streams", "create", "cli-a")
    st = cluster3.wait(lambda st: stream_of(st, "cli-a") is not None and all(
        m["committed_offset"] is not None for m in stream_of(st, "cli-a")["members"]), what="cli-a placed")
    s = stream_of(st, "cli-a")
    assert sorted(m["node"] for m in s["members"]) == ["n1", "n2", "n3"]
    leader = s["leader"]
    others = [n for n in nodes if n != leader]
    for srv in nodes.values():
        assert "cli-a" in names_on(srv)
    # creating it again through another node: the stream exists on the cluster
    r = rb(nodes[others[0]], "streams", "create", "cli-a")
    assert r.returncode == 1 and "already exists" in r.stderr, r.stderr

    # publish through a node that does not lead it: every line confirmed, stored once on the leader
    lines = "".join(f"line-{i}\n" for i in range(300))
    r = ok(nodes[others[0]], "publish", "cli-a", input=lines)
    cluster3.wait(lambda st: all(m["committed_offset"] == 300 for m in stream_of(st, "cli-a")["members"]),
                  what="every member at 300")

    # tail through each non-leader: every record once, in order
    for name in others:
        r = ok(nodes[name], "tail", "cli-a", "--from", "first", "--format", "raw")
        assert r.stdout.splitlines() == [f"line-{i}" for i in range(300)], (name, r.stdout[-300:], r.stderr)
        stats = json.loads(ok(nodes[name], "streams", "stats", "cli-a", "--json").stdout)
        assert stats["records"] == 300 and stats["last_offset"] == 299

    # a following tail through a non-leader reads from a replica (Metadata names the members)
    p = subprocess.Popen([*CLI, "tail", "cli-a", "--from", "first", "--follow", "--format", "raw", "--uri",
                          f"rabbitmq-stream://guest:guest@127.0.0.1:{nodes[others[1]].port}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        where = []
        while time.monotonic() < deadline and not where:
            where = [n for n, srv in nodes.items() if any(c["protocol"] == "stream" for c in consumers_on(srv, "cli-a"))]
            time.sleep(0.1)
        assert where and leader not in where, where
    finally:
        p.terminate()
        p.wait(10)

    # delete through a non-leader: gone from etcd and from every node
    r = ok(nodes[others[1]], "streams", "rm", "cli-a", "--json")
    assert json.loads(r.stdout) == {"stream": "cli-a", "deleted": True}
    cluster3.wait(lambda st: stream_of(st, "cli-a") is None, what="cli-a removed from etcd")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any("cli-a" in names_on(srv) for srv in nodes.values()):
        time.sleep(0.2)
    assert all("cli-a" not in names_on(srv) for srv in nodes.values())
    r = rb(nodes[leader], "tail", "cli-a")
    assert r.returncode == 1 and "does not exist" in r.stderr, r.stderr

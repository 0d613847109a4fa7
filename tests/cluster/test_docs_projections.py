"""Stream projections on three real nodes run once per cluster, on the node leading their channel, and
move with its leadership (issue 25; shells/cluster/docs.py ``runs_projection``). The changelog is led by
n1 and the channel by n2, so the test tells the two rules apart: the projection starts on n2 alone,
its documents reach every node through the changelog, and after n2 is killed -9 the channel's new
leader carries it on from the logged position, every event projected."""

import os
import sys

import pytest

from clusterfixtures import running_cluster
from test_docstore import CHANGELOG, LISTENERS, Ream, bson_find, bson_query, eventually, leader_of, run, sized, stream_of

from riverbed.shells.bson_tcp.client import BsonClient

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration"))
import rawwire  # noqa: E402

pytestmark = pytest.mark.integration

STARTED = "projection 'views' on 'clicks'"


@pytest.fixture
def docs3(tmp_path, etcd):
    with running_cluster(tmp_path, etcd, extra=LISTENERS) as c:
        yield c


def publish(c, node, events):
    async def go():
        async with await BsonClient.connect("127.0.0.1", c.nodes[node].ports["bson"]) as cl:
            for e in events:
                await cl.publish("clicks", e)
    run(go())


def view(c, node):
    return sorted((d["id"], d["v"]) for d in run(bson_query(c.nodes[node].ports["bson"], "clicks_view", {})))


def test_a_projection_runs_on_its_channels_leader_only_and_moves_with_it(docs3):
    c = docs3
    w = Ream(c.nodes["n1"].ports["ream"])
    assert w.request(sized("AGGREGATE SET carts 1", '{"n":1}'))[0] == "AGGREGATE SET DONE carts 1"
    w.close()
    assert leader_of(c, CHANGELOG) == "n1"
    r = rawwire.RawClient(c.nodes["n2"].port)
    try:
        assert r.handshake() == rawwire.OK
        assert r.create("clicks", {"queue-leader-locator": "client-local"}) == rawwire.OK
    finally:
        r.close()
    assert leader_of(c, "clicks") == "n2"
    c.wait(lambda st: all(m["lag"] == 0 for m in stream_of(st, "clicks")["members"]), what="clicks' members")

    async def define():
        async with await BsonClient.connect("127.0.0.1", c.nodes["n3"].ports["bson"]) as cl:
            # read your writes on one connection: n3 leads nothing, yet its next request sees the binder
            await cl.create_binder("own")
            assert "own" in await cl.list_binders()
            await cl.create_projection("views", channel="clicks", binder="clicks_view", doc_id="id", mode="replace")
            assert "clicks_view" in await cl.list_binders()
    run(define())
    publish(c, "n1", [{"id": i, "v": i} for i in range(10)])
    want = [(i, i) for i in range(10)]
    for node in ("n1", "n2", "n3"):
        assert eventually(lambda: view(c, node) == want, timeout=20, what=f"the view on {node}")
    # it ran on the channel's leader, nowhere else (not on the changelog's leader n1)
    ran = {n: sum(STARTED in ln for ln in c.nodes[n].lines) for n in ("n1", "n2", "n3")}
    assert ran == {"n1": 0, "n2": 1, "n3": 0}, ran

    # the channel's leader dies: its new leader goes on from the logged position
    c.nodes["n2"].kill()
    new = leader_of(c, "clicks", not_this="n2")
    other = "n3" if new == "n1" else "n1"
    assert eventually(lambda: any(STARTED in ln for ln in c.nodes[new].lines), timeout=20,
                      what=f"the projection on {new}")
    publish(c, other, [{"id": i, "v": i * 100} for i in range(5, 15)])
    want = [(i, i) for i in range(5)] + [(i, i * 100) for i in range(5, 15)]
    for node in (new, other):
        assert eventually(lambda: view(c, node) == want, timeout=20, what=f"the view on {node}")
    assert not any(STARTED in ln for ln in c.nodes[other].lines)
    assert run(bson_find(c.nodes[other].ports["bson"], "clicks_view", 14)) == {"id": 14, "v": 1400}

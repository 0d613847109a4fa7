"""A cluster node keeps etcd's keys by one watch instead of polling them (shells/cluster/etcdview.py):
an idle cluster asks etcd almost nothing and still works on what the watch brings."""

import time
import urllib.request

import pytest

import rawwire
from clusterfixtures import running_cluster

pytestmark = pytest.mark.integration


def etcd_reads(etcd):
    """Range and Txn calls etcd has answered so far (its gRPC server metrics: the gateway goes through them)."""
    with urllib.request.urlopen(etcd.url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("grpc_server_handled_total{") and ('grpc_method="Range"' in line
                                                                or 'grpc_method="Txn"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_an_idle_cluster_does_not_poll_etcd_and_still_replicates(tmp_path, etcd):
    with running_cluster(tmp_path, etcd, lease_ttl=1.0) as c:
        n1 = c.nodes["n1"]
        cl = rawwire.RawClient(n1.port)
        assert cl.handshake() == rawwire.OK
        assert cl.create("quiet") == rawwire.OK
        cl.close()
        st = c.wait(lambda s: any(x["name"] == "quiet" and all(m["lag"] == 0 for m in x["members"])
                                  and len(x["members"]) == 3 for x in s["streams"]), what="the stream on 3 nodes")
        time.sleep(1.0)
        before = etcd_reads(etcd)
        time.sleep(3.0)
        reads = etcd_reads(etcd) - before
        # polling read four directories every TTL/6 on each node: about 54 reads in 3 s; the watch leaves
        # the safety read (every 5 TTLs per node) and nothing else
        assert reads <= 6, f"{reads:.0f} etcd reads in 3 s of an idle 3-node cluster"
        # the cluster still works on what the watch brings: a stream made through n2 (led there) is
        # replicated and confirmed by a majority
        cl = rawwire.RawClient(c.nodes["n2"].port)
        assert cl.handshake() == rawwire.OK
        assert cl.create("quiet2", {"queue-leader-locator": "client-local"}) == rawwire.OK
        assert cl.declare_publisher(1, "quiet2") == rawwire.OK
        ok, bad = cl.publish_confirmed(1, [(i, b"m-%d" % i) for i in range(10)], timeout=10)
        cl.close()
        assert ok == set(range(10)) and not bad
        assert st["streams"]

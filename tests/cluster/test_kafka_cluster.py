"""Kafka on the cluster (issue 24 with issue 23): Metadata lists the three nodes as brokers with stable
ids and each partition's leader and replicas; a Produce to a non-leader is answered
NOT_LEADER_OR_FOLLOWER (never forwarded); confluent-kafka, bootstrapped from one node, produces 10k keyed
records to a three-partition topic whose leaders are on three different nodes and reads every one."""

import base64
import json
import os
import socket
import sys
import time
import urllib.request

import pytest

import rawwire
from clusterproc import Cluster

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "integration"))
from test_kafka_clients import raw_call  # noqa: E402
from test_replication import wait_placed  # noqa: E402

from riverbed.shells.cluster.kafka_view import node_id  # noqa: E402
from riverbed.shells.kafka import codec as C  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TOPIC = "kt"
N = 10_000


def http(port, method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def produce_raw(port, partition, value):
    """One Produce v9 of one record to partition ``partition`` of TOPIC on the node at ``port``."""
    batch = C.encode_batch(0, [(int(time.time() * 1000), b"k", value, [])])
    frame = C.encode_request(C.API_PRODUCE, 9, 7, "raw", {
        "transactional_id": None, "acks": -1, "timeout_ms": 5000,
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": partition, "records": batch}]}]})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        _, res = raw_call(s, frame, C.API_PRODUCE, 9)
    return res["responses"][0]["partition_responses"][0]


def test_kafka_clients_bootstrap_from_one_node_and_go_to_each_partition_leader(tmp_path, etcd):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    cluster = Cluster(tmp_path, etcd, extra=("--kafka-port", "0"))
    try:
        cluster.start()
        names = sorted(cluster.nodes)
        kafka = {n: cluster.nodes[n].ports["kafka"] for n in names}
        # partition i is made on node i, which leads it; every node knows the topic (a super stream over
        # the three partition streams, declared through each node's management API)
        for i, n in enumerate(names):
            c = rawwire.RawClient(cluster.nodes[n].port)
            assert c.handshake() == rawwire.OK and c.create(f"{TOPIC}-{i}") == rawwire.OK
            c.close()
        for i in range(3):
            wait_placed(cluster, f"{TOPIC}-{i}")
        for n in names:
            http_port = cluster.nodes[n].ports["http"]
            assert http(http_port, "PUT", f"/api/exchanges/%2F/{TOPIC}", {"type": "direct"}) in (201, 204)
            for i in range(3):
                assert http(http_port, "POST", f"/api/bindings/%2F/e/{TOPIC}/q/{TOPIC}-{i}",
                            {"routing_key": str(i), "arguments": {"x-stream-partition-order": i}}) == 201

        boot = f"127.0.0.1:{kafka['n1']}"
        # n1 learns the other nodes' partition streams from its etcd watch: a Metadata answered before it has
        # seen all three lists the ones it knows (a Kafka client refreshes), so wait until it lists three
        admin = AdminClient({"bootstrap.servers": boot})
        deadline = time.monotonic() + 20
        while True:
            md = admin.list_topics(TOPIC, timeout=10)
            if len(md.topics[TOPIC].partitions) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert {b.id: b.port for b in md.brokers.values()} == {node_id(n): kafka[n] for n in names}
        parts = md.topics[TOPIC].partitions
        assert {i: parts[i].leader for i in range(3)} == {i: node_id(n) for i, n in enumerate(names)}
        assert all(sorted(parts[i].replicas) == sorted(node_id(n) for n in names) for i in range(3))

        # a Produce to a node that does not lead the partition: NOT_LEADER_OR_FOLLOWER, nothing stored
        res = produce_raw(kafka["n2"], 0, b"not here")
        assert res["error_code"] == C.ERR_NOT_LEADER_OR_FOLLOWER
        assert produce_raw(kafka["n1"], 0, b"here")["error_code"] == 0

        # librdkafka from n1 only: keyed records go to each partition's leader
        p = Producer({"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
        errors = []
        for v in range(N):
            while True:
                try:
                    p.produce(TOPIC, key=b"key-%d" % v, value=b"%d" % v,
                              on_delivery=lambda err, msg: err and errors.append(err))
                    break
                except BufferError:
                    p.poll(0.01)
        assert p.flush(120) == 0 and errors == []
        del p

        c = Consumer({"bootstrap.servers": boot, "group.id": "kg", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
        c.subscribe([TOPIC])
        seen, per_partition = [], {}
        deadline = time.monotonic() + 90
        while len(seen) < N and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            per_partition[m.partition()] = per_partition.get(m.partition(), 0) + 1
            if m.value() != b"here":
                seen.append(int(m.value()))
        c.close()
        assert sorted(seen) == list(range(N))                      # every record, once
        assert len(per_partition) == 3 and min(per_partition.values()) > N // 10
    finally:
        cluster.stop()

"""The server's own streams (names starting ``__riverbed_``: shells/broker/internal.py) on a lone node: no
listing shows them and every protocol refuses a client's create, publish and delete on them with its own
access-refused error. The data dir holds ``__riverbed_docs`` (the cluster's document changelog) made by
the engine before the server starts, as a node that once was a cluster member would."""

import json
import os
import socket
import struct
import sys
import urllib.error
import urllib.request

import bson
import pytest
import zmq

from riverbed.engine import Engine

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cluster"))
import fwdclients  # noqa: E402
import rawwire  # noqa: E402
from procs import ServerProcess  # noqa: E402

pytestmark = pytest.mark.integration

INTERNAL = "__riverbed_docs"
RC_ACCESS_REFUSED = 0x10
RC_STREAM_DOES_NOT_EXIST = 0x02


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    data = tmp_path_factory.mktemp("internal") / "data"
    eng = Engine(str(data), fsync="never")
    eng.create_stream(INTERNAL).result(10)
    eng.append(INTERNAL, [b"a changelog record"]).result(10)
    eng.create_stream("visible").result(10)
    eng.close()
    s = ServerProcess(data, "--bson-port", "0", "--zmq-port", "0", "--ws-port", "0", "--ream-port", "0",
                      "--http-port", "0", "--kafka-port", "0").start()
    yield s
    s.kill()


def http(srv, path, method="GET"):
    req = urllib.request.Request(f"http://127.0.0.1:{srv.ports['http']}{path}", method=method,
                                 headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_no_listing_shows_an_internal_stream(srv):
    status, body = http(srv, "/api/streams")
    assert status == 200
    names = [s["name"] if isinstance(s, dict) else s for s in json.loads(body)]
    assert "visible" in names and INTERNAL not in names
    status, body = http(srv, "/api/queues")
    assert status == 200 and b"visible" in body and INTERNAL.encode() not in body
    status, body = http(srv, "/dashboard")
    assert INTERNAL.encode() not in body
    # /metrics keeps its per-stream series: an operator watches the changelog's size and compaction there
    # RabbitMQ Stream Metadata: as if it did not exist; StreamStats: refused
    c = rawwire.RawClient(srv.port)
    try:
        assert c.handshake() == rawwire.OK
        assert c.stream_stats(INTERNAL)[0] == RC_ACCESS_REFUSED
    finally:
        c.close()
    # Kafka: a full Metadata lists no such topic
    from confluent_kafka.admin import AdminClient
    topics = AdminClient({"bootstrap.servers": f"127.0.0.1:{srv.ports['kafka']}"}).list_topics(timeout=10).topics
    assert "visible" in topics and INTERNAL not in topics
    # the CLI's list is the JSON API's
    import subprocess
    for where in (["--uri", f"rabbitmq-stream://guest:guest@127.0.0.1:{srv.port}",
                   "--http-uri", f"http://127.0.0.1:{srv.ports['http']}"], ["--data-dir", srv.data_dir]):
        out = subprocess.run([sys.executable, "-m", "riverbed.shells.cli", "streams", "ls", "--json", *where],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "visible" in out.stdout and INTERNAL not in out.stdout


def test_every_protocol_refuses_to_create_publish_or_delete_one(srv):
    c = rawwire.RawClient(srv.port)
    try:
        assert c.handshake() == rawwire.OK
        assert c.create("__riverbed_mine") == RC_ACCESS_REFUSED
        assert c.delete(INTERNAL) == RC_ACCESS_REFUSED
        assert c.declare_publisher(1, INTERNAL, "p") == RC_ACCESS_REFUSED
    finally:
        c.close()
    for proto in ("bson", "zmq", "ws", "ream"):
        for name in (INTERNAL, "__riverbed_new"):
            pub = fwdclients.publisher(proto, srv, name)
            try:
                assert pub.publish(1) is False, (proto, name)
            finally:
                pub.close()
    # Kafka Produce: TOPIC_AUTHORIZATION_FAILED
    from confluent_kafka import KafkaException, Producer
    p = Producer({"bootstrap.servers": f"127.0.0.1:{srv.ports['kafka']}", "message.timeout.ms": 5000,
                  "allow.auto.create.topics": False})
    errs = []
    p.produce(INTERNAL, b"x", on_delivery=lambda err, msg: errs.append(err))
    p.flush(10)
    assert errs and errs[0] is not None and errs[0].code() in (29, 3), errs   # refused or unknown, never stored
    # the management API's delete
    status, _ = http(srv, f"/api/queues/%2F/{INTERNAL}", method="DELETE")
    assert status in (401, 403, 404)
    # nothing changed: the stream holds its one record
    eng = Engine(srv.data_dir, readonly=True)
    try:
        assert eng.stream_info(INTERNAL).records == 1
        assert not eng.has_stream("__riverbed_mine") and not eng.has_stream("__riverbed_new")
    finally:
        eng.close()
